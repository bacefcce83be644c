"""Who may do what with runs: the run's project decides (viewers read, editors steer, others see nothing)."""

from __future__ import annotations

import pytest
from conftest import add_member, new_project, wait_finished
from starlette.websockets import WebSocketDisconnect


@pytest.fixture
def shared_run(owner, person):
    """A finished run in a project with a viewer and an editor, plus a stranger."""
    pid = new_project(owner, {"main.py": "print('private output')\n"})
    viewer, editor, stranger = person(), person(), person()
    add_member(owner, pid, viewer, "viewer")
    add_member(owner, pid, editor, "editor")
    run = wait_finished(owner, owner.post(f"/api/projects/{pid}/runs", json={}).json()["id"])
    return pid, run, viewer, editor, stranger


def close_code(client, url: str) -> int:
    with client.websocket_connect(url) as ws:
        with pytest.raises(WebSocketDisconnect) as closed:
            while True:
                ws.receive_json()
    return closed.value.code


def test_viewers_read_runs_but_cannot_start_cancel_or_open_a_shell(shared_run):
    pid, run, viewer, editor, _ = shared_run
    assert viewer.get(f"/api/runs/{run['id']}").json()["stdout"] == "private output\n"
    assert [r["id"] for r in viewer.get(f"/api/projects/{pid}/runs").json()] == [run["id"]]
    assert viewer.post(f"/api/projects/{pid}/runs", json={}).status_code == 403
    assert viewer.post(f"/api/runs/{run['id']}/cancel").status_code == 403
    assert close_code(viewer, f"/ws/projects/{pid}/shell") == 4403
    assert editor.post(f"/api/runs/{run['id']}/cancel").json()["verdict"] == "ok"  # over: nothing to cancel


def test_strangers_get_404_and_anonymous_callers_401(shared_run, anon):
    pid, run, _, _, stranger = shared_run
    for client, status in ((stranger, 404), (anon, 401)):
        assert client.get(f"/api/runs/{run['id']}").status_code == status
        assert client.post(f"/api/runs/{run['id']}/cancel").status_code == status
        assert client.post(f"/api/projects/{pid}/runs", json={}).status_code == status
        assert client.get(f"/api/projects/{pid}/runs").status_code == status
    assert "private output" not in stranger.get(f"/api/runs/{run['id']}").text
    assert close_code(stranger, f"/ws/projects/{pid}/shell") == 4404
    assert close_code(anon, f"/ws/projects/{pid}/shell") == 4401
    assert close_code(anon, f"/ws/runs/{run['id']}") == 4401


def test_cross_site_cookie_handshake_is_refused(served, shared_run):
    pid, run, *_ = shared_run
    served.post("/api/auth/login", json={"username": "nobody-here", "password": "x"})  # no cookie set
    assert close_code(served, f"/ws/runs/{run['id']}") == 4401
