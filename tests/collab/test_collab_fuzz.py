"""Many real Yjs clients, random edits and reconnects, and server crashes: one text, nothing lost."""

from __future__ import annotations

import time
from pathlib import Path

from collab_testkit import CollabServer, assert_nothing_duplicated_or_lost, run_fuzz, stored_text, wait_for_file

SEED = "a😀b\n"
SECONDS = 9


def test_random_editing_with_reconnects_and_two_server_crashes(
    server: CollabServer, node_modules: None, project_root: Path, project_id: str, db_url: str
) -> None:
    path = project_root / project_id / "shared.md"
    path.write_text(SEED, encoding="utf-8")

    def crash_twice() -> None:
        for _ in range(2):
            time.sleep(SECONDS / 3)
            server.kill()  # SIGKILL: no graceful flush of anything
            time.sleep(0.3)
            server.start()

    result = run_fuzz([server.ws_url], project_id, "shared.md", clients=8, seconds=SECONDS, meanwhile=crash_twice)
    assert len(result["inserted"]) > 200
    text = assert_nothing_duplicated_or_lost(result, SEED)
    wait_for_file(path, text)
    assert stored_text(db_url, f"{project_id}/shared.md") == text
