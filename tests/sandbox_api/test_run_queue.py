"""Issue 14, defect 5, over the API with the server's default settings: a freshly registered user who
keeps sleeping runs going cannot make another user's one-line program wait for one of them to end,
and queued runs show their place in the queue (GET and the run's socket)."""

from __future__ import annotations

from datetime import datetime

from conftest import new_project, wait_finished

SLEEP_SECONDS = 4


def test_a_sleeping_user_leaves_a_slot_for_someone_else(person, app):
    hog, other = person(), person()
    slow = new_project(hog, {"main.py": f"import time\ntime.sleep({SLEEP_SECONDS})\n"})
    quick = new_project(other, {"main.py": "print(1)\n"})
    hogged = [hog.post(f"/api/projects/{slow}/runs", json={"stdin": ""}).json() for _ in range(4)]
    run = wait_finished(other, other.post(f"/api/projects/{quick}/runs", json={}).json()["id"])
    waited = datetime.fromisoformat(run["started_at"]).timestamp() - datetime.fromisoformat(run["created_at"]).timestamp()
    print(f"\nthe other user's print(1) waited {waited:.2f} s while 4 runs of {SLEEP_SECONDS} s were submitted first")
    assert (run["verdict"], run["stdout"]) == ("ok", "1\n")
    assert waited < SLEEP_SECONDS / 2  # not until one of the sleeping runs ends

    per_user = app.state.settings.sandbox_max_running_per_user
    assert [r["status"] for r in hogged] == ["running"] * per_user + ["queued"] * (4 - per_user)
    assert [r["queue_position"] for r in hogged] == [None] * per_user + list(range(1, 4 - per_user + 1))

    with hog.websocket_connect(f"/ws/runs/{hogged[-1]['id']}") as ws:
        assert ws.receive_json() == {"type": "status", "status": "queued", "queue_position": 4 - per_user,
                                     "waiting_for_input": False, "listening_port": None, "preview_url": None}
        hog.post(f"/api/runs/{hogged[0]['id']}/cancel")  # its slot goes to the hog's next run: one place up
        assert ws.receive_json() == {"type": "status", "status": "queued", "queue_position": 4 - per_user - 1,
                                     "waiting_for_input": False, "listening_port": None, "preview_url": None}
    for r in hogged:
        hog.post(f"/api/runs/{r['id']}/cancel")
    assert {wait_finished(hog, r["id"])["verdict"] for r in hogged} == {"cancelled"}

