"""Many real Yjs clients, random edits and reconnects, and server crashes: one text, nothing lost."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from collab_testkit import JS_DIR, CollabServer, stored_text, token

SEED = "a😀b\n"
CLIENTS = 8
SECONDS = 9


def test_random_editing_with_reconnects_and_two_server_crashes(
    server: CollabServer, node_modules: None, project_root: Path, project_id: str, db_url: str
) -> None:
    path = project_root / project_id / "shared.md"
    path.write_text(SEED, encoding="utf-8")
    config = {
        "url": server.ws_url, "project": project_id, "file": "shared.md", "clients": CLIENTS,
        "seconds": SECONDS, "tokens": [token(f"user{i}") for i in range(CLIENTS)],
    }
    fuzz = subprocess.Popen(
        ["node", str(JS_DIR / "fuzz.js"), json.dumps(config)],
        cwd=JS_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    for _ in range(2):
        time.sleep(SECONDS / 3)
        server.kill()  # SIGKILL: no graceful flush of anything
        time.sleep(0.3)
        server.start()
    out, err = fuzz.communicate(timeout=90)
    assert fuzz.returncode == 0, err
    result = json.loads(out)
    assert result["converged"], result["texts"]
    text = result["texts"][0]

    inserted, deleted = result["inserted"], set(result["deleted"])
    assert len(inserted) > 200
    assert deleted and len(set(inserted)) == len(inserted)
    for marker in inserted:
        assert text.count(marker) == (0 if marker in deleted else 1), marker
    # Nothing but the seed and the surviving marker lines: no duplicated or stray content.
    assert re.sub(r"\n⟦[^⟧]*⟧", "", text) == SEED

    deadline = time.monotonic() + 2
    while path.read_text(encoding="utf-8") != text and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.read_text(encoding="utf-8") == text
    assert stored_text(db_url, f"{project_id}/shared.md") == text
