"""Project templates: folders of starter files under ide_server/project_templates/<id>/."""

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ide_server.errors import InvalidInput

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "project_templates"


@dataclass(frozen=True)
class Template:
    id: str
    title: str
    description: str


@cache
def all_templates() -> tuple[Template, ...]:
    """The templates listed in project_templates/index.json, in its order."""
    entries = json.loads((TEMPLATES_DIR / "index.json").read_text())
    return tuple(Template(**entry) for entry in entries)


def template_dir(template_id: str) -> Path:
    if template_id not in {t.id for t in all_templates()}:
        known = ", ".join(t.id for t in all_templates())
        raise InvalidInput(f"unknown template {template_id!r}; choose one of: {known}")
    return TEMPLATES_DIR / template_id
