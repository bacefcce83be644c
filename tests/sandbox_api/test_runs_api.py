"""Running a project's code over the API: start, read, list, cancel, queue limits, files coming back."""

from __future__ import annotations

import threading
import time

from conftest import new_project, wait_finished
from sqlalchemy import select, text

from ide_server.models import User
from sandbox.models import RunRow


def test_run_a_python_file_and_read_its_outcome(owner):
    pid = new_project(owner, {"main.py": "import sys\nprint(input().upper())\nprint('oops', file=sys.stderr)\n"})
    started = owner.post(f"/api/projects/{pid}/runs", json={"stdin": "hello\n"})
    assert started.status_code == 202, started.text
    assert started.json()["argv"] == ["python3", "./main.py"]
    run = wait_finished(owner, started.json()["id"])
    assert run["verdict"] == "ok", {k: run[k] for k in ("exit_code", "signal", "stderr", "message", "wall_seconds")}
    assert run["stdout"] == "HELLO\n" and run["stderr"] == "oops\n"
    assert run["cpu_seconds"] >= 0 and run["wall_seconds"] > 0 and run["exit_code"] == 0
    assert [r["id"] for r in owner.get(f"/api/projects/{pid}/runs").json()] == [run["id"]]


def test_runtime_error_and_limits_from_the_request(owner):
    pid = new_project(owner, {"main.py": "while True: pass\n", "bad.py": "raise SystemExit(3)\n"})
    run = wait_finished(owner, owner.post(f"/api/projects/{pid}/runs", json={"entry": "bad.py"}).json()["id"])
    assert (run["verdict"], run["exit_code"]) == ("runtime_error", 3)
    started = owner.post(f"/api/projects/{pid}/runs", json={"limits": {"cpu_seconds": 0.5}})
    run = wait_finished(owner, started.json()["id"])
    assert run["verdict"] == "time_limit" and run["cpu_seconds"] < 2


def test_bad_requests_are_clear_400s(owner):
    pid = new_project(owner, {"notes.txt": "hi"})
    answer = owner.post(f"/api/projects/{pid}/runs", json={"entry": "notes.txt"})
    assert answer.status_code == 400 and "cannot tell how to run 'notes.txt'" in answer.json()["detail"]
    answer = owner.post(f"/api/projects/{pid}/runs", json={"entry": "../../etc/passwd"})
    assert answer.status_code == 400 and "inside the project" in answer.json()["detail"]
    answer = owner.post(f"/api/projects/{pid}/runs", json={"entry": "notes.txt", "limits": {"nope": 1}})
    assert answer.status_code == 422


def test_files_the_program_writes_come_back(owner):
    pid = new_project(owner, {"main.py": "import os\nos.makedirs('out', exist_ok=True)\nopen('out/result.txt','w').write('42')\n"})
    run = wait_finished(owner, owner.post(f"/api/projects/{pid}/runs", json={}).json()["id"])
    assert run["files_written"] == ["out/result.txt"]
    assert owner.get(f"/api/projects/{pid}/files/content/out/result.txt").content == b"42"


def test_a_run_checkpoints_the_project_first(owner):
    pid = new_project(owner, {"main.py": "print('checkpointed')\n"})
    wait_finished(owner, owner.post(f"/api/projects/{pid}/runs", json={}).json()["id"])
    history = owner.get(f"/api/projects/{pid}/history")
    assert history.status_code == 200, history.text
    assert "Checkpoint before a run" in [c["message"] for c in history.json()]
    checkpoint = next(c for c in history.json() if c["message"] == "Checkpoint before a run")
    main_at_checkpoint = owner.get(f"/api/projects/{pid}/history/{checkpoint['version']}/files/main.py")
    assert main_at_checkpoint.text == "print('checkpointed')\n"


def test_cancel_a_running_program(owner):
    pid = new_project(owner, {"main.py": "import time\nprint('up', flush=True)\ntime.sleep(30)\n"})
    run_id = owner.post(f"/api/projects/{pid}/runs", json={"stdin": ""}).json()["id"]
    wait_until_output(owner, run_id, "up")
    assert owner.post(f"/api/runs/{run_id}/cancel").status_code == 200
    run = wait_finished(owner, run_id)
    assert run["verdict"] == "cancelled" and run["wall_seconds"] < 10, run


def wait_until_output(client, run_id: str, text: str) -> None:
    import time

    deadline = time.monotonic() + 10
    while text not in client.get(f"/api/runs/{run_id}").json()["stdout"]:
        assert time.monotonic() < deadline, "the program never printed"
        time.sleep(0.05)


def test_queue_full_answers_429_with_a_message(owner, app):
    pid = new_project(owner, {"main.py": "import time\ntime.sleep(30)\n"})
    service = app.state.services.runs.queue
    ids = [owner.post(f"/api/projects/{pid}/runs", json={"stdin": ""}).json()["id"] for _ in range(service.max_per_user)]
    refused = owner.post(f"/api/projects/{pid}/runs", json={})
    assert refused.status_code == 429 and "runs waiting or running" in refused.json()["detail"]
    assert refused.headers["Retry-After"]
    for run_id in ids:
        owner.post(f"/api/runs/{run_id}/cancel")
    assert {wait_finished(owner, run_id)["verdict"] for run_id in ids} == {"cancelled"}


def test_runs_another_server_holds_count_against_the_users_limit(owner, app):
    """Workers and replicas each queue their own runs: the user's limit is counted in the database they
    share, so a user whose starts land on N processes cannot hold N times as many."""
    pid = new_project(owner, {"main.py": "print(1)\n"})
    limit, username = app.state.services.runs.queue.max_per_user, owner.get("/api/me").json()["username"]
    with app.state.sessionmaker() as db, db.begin():
        user_id = db.scalar(select(User.id).where(User.username == username))
        db.add_all(RunRow(id=f"elsewhere{i}", project_id=pid, user_id=user_id, argv=["python3", "main.py"],
                          status="running", server_id="other-worker") for i in range(limit))
    refused = owner.post(f"/api/projects/{pid}/runs", json={})
    assert refused.status_code == 429 and "runs waiting or running" in refused.json()["detail"]
    with app.state.sessionmaker() as db, db.begin():
        db.get(RunRow, "elsewhere0").status = "finished"  # (as the other server stores an outcome)
    assert wait_finished(owner, owner.post(f"/api/projects/{pid}/runs", json={}).json()["id"])["verdict"] == "ok"


def test_starting_a_run_waits_for_the_database_off_the_event_loop(owner, app):
    """The run's record was inserted on the event loop: while another writer held SQLite's write lock
    (a class's collab writes hold it often), the whole server stopped, every request and socket with
    it (issue 25)."""
    pid = new_project(owner, {"main.py": "print(1)\n"})
    held, release, let_go = threading.Event(), threading.Event(), threading.Event()

    def hold_the_write_lock() -> None:
        with app.state.sessionmaker() as db:
            db.execute(text("UPDATE users SET username = username WHERE id = -1"))  # takes the write lock
            held.set()
            release.wait(10)
            db.commit()
        let_go.set()

    holder = threading.Thread(target=hold_the_write_lock)
    holder.start()
    held.wait(5)
    started: list = []
    starter = threading.Thread(target=lambda: started.append(owner.post(f"/api/projects/{pid}/runs", json={})))
    starter.start()
    time.sleep(1.5)  # the run's start is now waiting for the lock
    answered_while_held = owner.get("/healthz").status_code == 200 and not let_go.is_set()
    release.set()
    holder.join()
    starter.join()
    assert answered_while_held
    assert started[0].status_code == 202, started[0].text
    assert wait_finished(owner, started[0].json()["id"])["verdict"] == "ok"
