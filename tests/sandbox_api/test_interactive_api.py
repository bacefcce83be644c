"""Runs from the editor over the API: interactive runs pause their clock at input(), and every member hears of runs."""

from __future__ import annotations

import time

from conftest import add_member, new_project, wait_finished
from test_run_sockets import frames_until_exit


def test_an_interactive_run_waits_past_its_wall_limit(owner):
    pid = new_project(owner, {"main.py": "print('hi', input())\n"})
    strict = owner.post(f"/api/projects/{pid}/runs", json={"limits": {"wall_seconds": 1}}).json()
    run = owner.post(f"/api/projects/{pid}/runs", json={"interactive": True, "limits": {"wall_seconds": 1}}).json()
    assert wait_finished(owner, strict["id"])["verdict"] == "time_limit"
    time.sleep(1)
    assert owner.get(f"/api/runs/{run['id']}").json()["waiting_for_input"] is True
    with owner.websocket_connect(f"/ws/runs/{run['id']}") as ws:
        ws.send_json({"type": "stdin", "data": "there\n"})
        frames = frames_until_exit(ws)
    assert frames[-1]["verdict"] == "ok" and frames[-1]["wall_seconds"] > 1
    assert "".join(f["data"] for f in frames if f["type"] == "stdout") == "hi there\n"
    assert frames[0] == {"type": "status", "status": "running", "queue_position": None, "waiting_for_input": True,
                         "listening_port": None, "preview_url": None}


def test_a_bad_packages_setting_is_a_400_naming_it(owner):
    pid = new_project(owner, {"main.py": "print(1)\n", "codeyard.toml": "[packages]\nauto_install = 'no'\n"})
    answer = owner.post(f"/api/projects/{pid}/runs", json={"interactive": True})
    assert answer.status_code == 400 and "packages.auto_install must be true or false" in answer.json()["detail"]


def test_members_hear_of_runs_and_the_files_they_write(owner, person):
    pid = new_project(owner, {"main.py": "open('made.txt', 'w').write('x')\n"})
    viewer = person()
    add_member(owner, pid, viewer, "viewer")
    with viewer.websocket_connect(f"/ws/projects/{pid}/events") as events:
        assert events.receive_json()["type"] == "presence"
        run = owner.post(f"/api/projects/{pid}/runs", json={"interactive": True}).json()
        heard = events.receive_json()
        assert heard == {"type": "run", "id": run["id"], "username": owner.username, "argv": ["python3", "./main.py"],
                         "interactive": True}
        assert events.receive_json() == {"type": "files", "action": "run", "path": "", "to": None}
    assert wait_finished(owner, run["id"])["files_written"] == ["made.txt"]
    assert viewer.get(f"/api/projects/{pid}/runs").json()[0]["username"] == owner.username  # a console opened later names them
