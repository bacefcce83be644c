"""Two app replicas sharing the database, joined through a real redis-server."""

from __future__ import annotations

from pathlib import Path

import pytest
from collab_testkit import (
    CollabServer,
    JsClients,
    assert_nothing_duplicated_or_lost,
    run_fuzz,
    stored_text,
    token,
    wait_for_file,
)
from waiting import wait_until

SEED = "shared 🦊\n"


@pytest.fixture
def replicas(db_url: str, redis_url: str, project_root: Path, project_id: str, tmp_path: Path, node_modules: None):
    (project_root / project_id / "app.py").write_text(SEED, encoding="utf-8")
    servers = [
        CollabServer(db_url, project_root, tmp_path / f"replica{i}.log", redis_url=redis_url) for i in range(2)
    ]
    for srv in servers:
        srv.start()
    yield servers
    for srv in servers:
        srv.stop()


def test_clients_on_two_replicas_see_each_others_edits_cursors_and_revocation(replicas, project_id: str) -> None:
    a, b = replicas
    on_a, on_b = JsClients(a.ws_url), JsClients(b.ws_url)
    try:
        on_a.call("open", name="alice", project=project_id, file="app.py", token=token("alice"), user="alice")
        on_b.call("open", name="bob", project=project_id, file="app.py", token=token("bob"), user="bob")
        on_a.call("insert", name="alice", index=0, text="# ünïcode 😀\n")
        on_b.call("wait_text", name="bob", text="# ünïcode 😀\n" + SEED)
        on_b.call("set_cursor", name="bob", index=3)
        on_a.call("wait_users", name="alice", users=["bob"])
        on_b.call("wait_users", name="bob", users=["alice"])
        wait_until(lambda: on_a.call("cursor_of", name="alice", user="bob")["index"] == 3)
        on_b.call("close", name="bob")
        on_a.call("wait_users", name="alice", users=[], timeout=2000)
        # Access revoked through replica A closes mallory's socket on replica B.
        on_b.call("open", name="mallory", project=project_id, file="app.py", token=token("mallory"), user="mallory")
        a.post(f"/test/revoke/{project_id}/mallory")
        assert on_b.call("wait_closed", name="mallory")["closeCodes"][0] == 4403
    finally:
        on_a.close()
        on_b.close()


def test_random_editing_across_replicas_converges(replicas, project_root: Path, project_id: str, db_url: str) -> None:
    result = run_fuzz([srv.ws_url for srv in replicas], project_id, "app.py", clients=6, seconds=5)
    text = assert_nothing_duplicated_or_lost(result, SEED)
    wait_for_file(project_root / project_id / "app.py", text)
    assert stored_text(db_url, f"{project_id}/app.py") == text
