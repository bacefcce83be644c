"""Print the OpenAPI document of the IDE's browser API, /api (JSON, keys sorted), for `make web-types`.

The app is built as `codeyard serve` builds it, with every component, on a throwaway data folder and
SQLite database, so the document does not depend on this machine's settings or data. Only /api is
kept (with the schemas it reaches): the browser calls nothing else, and the LLM's /v1 and /v2 follow
OpenAI's and KServe's own documents.
"""

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from ide_server.app import create_app
from ide_server.settings import Settings

BROWSER_PREFIX = "/api/"
SCHEMA_REF = "#/components/schemas/"


def app_document() -> dict[str, Any]:
    """The whole document of the app."""
    with tempfile.TemporaryDirectory(prefix="codeyard-openapi-") as folder:
        data_dir = Path(folder)
        app = create_app(Settings(data_dir=data_dir, database_url=f"sqlite:///{data_dir / 'codeyard.db'}",
                                  log_level="warning"))
        document = app.openapi()
        app.state.engine.dispose()
    return document


def browser_document(document: dict[str, Any]) -> dict[str, Any]:
    """The document's /api paths and the component schemas they reach, directly or through others."""
    paths = {path: item for path, item in document["paths"].items() if path.startswith(BROWSER_PREFIX)}
    schemas = document.get("components", {}).get("schemas", {})
    reached: set[str] = set()
    pending = [paths]
    while pending:
        for name in _schema_refs(pending.pop()) - reached:
            reached.add(name)
            pending.append(schemas[name])
    kept = {name: schemas[name] for name in sorted(reached)}
    return {**document, "paths": paths, "components": {**document.get("components", {}), "schemas": kept}}


def _schema_refs(node: Any) -> set[str]:
    if isinstance(node, list):
        return set().union(*(_schema_refs(item) for item in node))
    if not isinstance(node, dict):
        return set()
    refs = set().union(*(_schema_refs(value) for value in node.values()))
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(SCHEMA_REF):
        refs.add(ref.removeprefix(SCHEMA_REF))
    return refs


def main() -> None:
    for name in [name for name in os.environ if name.startswith("CODEYARD_")]:
        del os.environ[name]  # the default settings, whatever this shell has set
    json.dump(browser_document(app_document()), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
