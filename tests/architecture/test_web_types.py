"""The browser's API types are generated, never written by hand: web/src/api/schema.d.ts must equal what
`make web-types` writes from the app's OpenAPI document, so a route or schema changed without
regenerating them fails here (and `npm run build` type-checks the pages against them)."""

import difflib
import runpy
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "web" / "src" / "api" / "schema.d.ts"


def test_the_committed_api_types_are_current(tmp_path):
    fresh = tmp_path / "schema.d.ts"
    made = subprocess.run(["bash", "scripts/web-types.sh", str(fresh)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    diff = list(difflib.unified_diff(COMMITTED.read_text().splitlines(), fresh.read_text().splitlines(),
                                     "committed", "generated now", lineterm="", n=1))
    assert not diff, "web/src/api/schema.d.ts is out of date: run `make web-types` and commit it\n" + "\n".join(diff[:60])


def _refs(node: Any) -> list[str]:
    if isinstance(node, list):
        return [ref for item in node for ref in _refs(item)]
    if not isinstance(node, dict):
        return []
    own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
    return own + [ref for value in node.values() for ref in _refs(value)]


def test_every_reference_in_the_app_openapi_document_resolves():
    """Whole document, /v1 and /v2 included: a schema pasted in with its own local "#/$defs/..."
    references would point nowhere (Swagger UI and the generator fail on it)."""
    document = runpy.run_path(str(REPO / "scripts" / "openapi_document.py"))["app_document"]()
    unresolved = []
    for ref in sorted(set(_refs(document))):
        node: Any = document
        for part in ref.removeprefix("#/").split("/"):
            node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) else None
        if not ref.startswith("#/") or node is None:
            unresolved.append(ref)
    assert len(document["paths"]) > 50
    assert not unresolved, unresolved
