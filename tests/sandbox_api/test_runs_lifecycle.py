"""Runs across server restarts, with no sandbox at all, and files reaching an open editor's room."""

from __future__ import annotations

import time

from conftest import Person, make_app, new_project, wait_finished
from fastapi.testclient import TestClient

from collab.room import RoomKey


def test_run_records_outlive_the_server(owner, app):
    pid = new_project(owner, {"main.py": "print('kept')\n"})
    run_id = owner.post(f"/api/projects/{pid}/runs", json={}).json()["id"]
    assert wait_finished(owner, run_id)["verdict"] == "ok"
    restarted = make_app(app.state.settings.data_dir)
    with TestClient(restarted) as client:
        again = Person(client, owner.token)
        deadline = time.monotonic() + 5
        while (run := again.get(f"/api/runs/{run_id}").json())["verdict"] is None:  # stored as the run ends
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert (run["stdout"], run["status"], run["verdict"]) == ("kept\n", "finished", "ok")
        assert [r["id"] for r in again.get(f"/api/projects/{pid}/runs").json()] == [run_id]
        # too late to follow it live: the socket replays what was stored and ends as a followed run does
        with again.websocket_connect(f"/ws/runs/{run_id}") as ws:
            assert ws.receive_json() == {"type": "stdout", "data": "kept\n"}
            exit_frame = ws.receive_json()
            assert (exit_frame["type"], exit_frame["id"], exit_frame["verdict"]) == ("exit", run_id, "ok")
            assert "stdout" not in exit_frame and ws.receive()["code"] == 1000
    restarted.state.engine.dispose()


def test_no_sandbox_means_503_with_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # no Docker engine answers
    application = make_app(tmp_path, backend="docker")
    with TestClient(application) as client:
        csrf = client.post("/api/auth/register", json={"username": "nobox", "password": "pass-word-1"}).json()["csrf_token"]
        client.headers["X-CSRF-Token"] = csrf
        pid = client.post("/api/projects", json={"name": "p"}).json()["id"]
        answer = client.post(f"/api/projects/{pid}/runs", json={})
        assert answer.status_code == 503
        assert "install Docker" in answer.json()["detail"] and "never runs code unsandboxed" in answer.json()["detail"]
        with client.websocket_connect(f"/ws/projects/{pid}/shell") as ws:
            closed = ws.receive()
        assert closed["code"] == 4503 and "install" in closed["reason"]
    application.state.engine.dispose()


def test_written_files_reach_an_open_editor(owner, served):
    pid = new_project(owner, {"notes.md": "draft\n", "main.py": "open('notes.md', 'a').write('from the program\\n')\n"})
    rooms = served.app.state.services.rooms
    room = served.portal.call(rooms.acquire, RoomKey(pid, "notes.md"))  # as an editor tab holds it
    try:
        assert str(room.text) == "draft\n"
        run = wait_finished(owner, owner.post(f"/api/projects/{pid}/runs", json={}).json()["id"])
        assert run["files_written"] == ["notes.md"]
        deadline = time.monotonic() + 5
        while str(room.text) != "draft\nfrom the program\n":
            assert time.monotonic() < deadline, str(room.text)
            time.sleep(0.05)
        time.sleep(1)  # several disk-mirror polls later, the change is still there once
        assert str(room.text) == "draft\nfrom the program\n"
    finally:
        served.portal.call(rooms.release, room)


def test_a_second_server_on_the_host_does_not_sweep_live_runs(owner, app, tmp_path):
    pid = new_project(owner, {"main.py": "import time\nprint('up', flush=True)\ntime.sleep(30)\n"})
    run_id = owner.post(f"/api/projects/{pid}/runs", json={"stdin": ""}).json()["id"]
    deadline = time.monotonic() + 10
    while "up" not in owner.get(f"/api/runs/{run_id}").json()["stdout"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    other = make_app(tmp_path)
    with TestClient(other):  # its start-up would sweep a crashed server's leftovers, but this one is alive
        pass
    other.state.engine.dispose()
    assert owner.get(f"/api/runs/{run_id}").json()["status"] == "running"
    owner.post(f"/api/runs/{run_id}/cancel")
    assert wait_finished(owner, run_id)["verdict"] == "cancelled"
