"""Releases under load: redeploy and rollback drop no request, a failing health check never serves,
a crashed instance restarts, scaling spreads requests round-robin."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from waiting import wait_until

from deploy.conftest import deploy, new_project, wait_release, write_files

APP = '''
import os, uuid
from flask import Flask

app = Flask(__name__)
INSTANCE = uuid.uuid4().hex


@app.get("/")
def home():
    return "{version}"


@app.get("/instance")
def instance():
    return INSTANCE


@app.get("/healthz")
def health():
    if "{version}" == "broken":
        print("health check: the database is unreachable", flush=True)
        return "broken", 500
    return "ok"


@app.post("/crash")
def crash():
    os._exit(3)


@app.get("/slow")
def slow():
    import time
    time.sleep(6)
    return "slow {version}"
'''


def app_files(version: str, health: str = "/") -> dict[str, str]:
    return {"app.py": APP.replace("{version}", version), "codeyard.toml": f'[deploy]\nhealth = "{health}"\n'}


class LoadLoop:
    """Requests the app without pause from a thread; records every status and body."""

    def __init__(self, client, url: str) -> None:
        self.client, self.url = client, url
        self.seen: list[tuple[int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            response = self.client.get(self.url)
            self.seen.append((response.status_code, response.text))

    def __enter__(self) -> LoadLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def failures(self) -> list[tuple[int, str]]:
        return [s for s in self.seen if s[0] != 200]


def test_redeploy_and_rollback_under_load_fail_no_request(owner, edge):
    project_id = new_project(owner, app_files("v1"))
    first = deploy(owner, project_id)
    assert first["status"] == "running", first["releases"][0]["message"]
    url = first["url"]
    with LoadLoop(owner.client, url) as load, LoadLoop(edge, url) as edge_load:  # both doors at once
        write_files(owner, project_id, app_files("v2"))
        second = deploy(owner, project_id)
        assert second["current_release"]["number"] == 2, second["releases"][0]["message"]
        wait_until(lambda: load.seen and load.seen[-1][1] == "v2", timeout=60)
        rollback_to = next(r for r in second["releases"] if r["number"] == 1)
        assert rollback_to["can_roll_back"]
        response = owner.post(f"/api/projects/{project_id}/deployment/rollback", json={"release_id": rollback_to["id"]})
        assert response.status_code == 202, response.text
        rolled = wait_release(owner, project_id, rollback_to["id"])
        assert rolled["current_release"]["id"] == rollback_to["id"]
        wait_until(lambda: load.seen[-1][1] == "v1" and edge_load.seen[-1][1] == "v1", timeout=60)
        time.sleep(0.3)
    for loop in (load, edge_load):
        assert len(loop.seen) > 50
        assert loop.failures() == []
        versions = [text for _, text in loop.seen]
        assert set(versions) == {"v1", "v2"}
        assert versions[-1] == "v1"
    statuses = {r["number"]: r["status"] for r in rolled["releases"]}
    assert statuses == {1: "live", 2: "retired"}


def test_a_release_failing_its_health_check_never_serves(owner):
    project_id = new_project(owner, app_files("v1", health="/healthz"))
    assert deploy(owner, project_id)["status"] == "running"
    url = owner.get(f"/api/projects/{project_id}/deployment").json()["url"]
    with LoadLoop(owner.client, url) as load:
        write_files(owner, project_id, app_files("broken", health="/healthz"))
        deployment = deploy(owner, project_id)
        time.sleep(0.2)
    failed = deployment["releases"][0]
    assert failed["status"] == "failed" and deployment["status"] == "running"
    assert "HTTP 500 from /healthz" in failed["message"]
    assert "health check: the database is unreachable" in failed["message"]  # the failure comes with the app's log
    assert deployment["current_release"]["number"] == 1
    assert load.failures() == [] and {text for _, text in load.seen} == {"v1"}


def test_a_crashed_instance_restarts_and_serves_again(owner):
    project_id = new_project(owner, app_files("v1"))
    url = deploy(owner, project_id)["url"]
    before = owner.client.get(f"{url}instance").text
    owner.client.post(f"{url}crash")
    wait_until(lambda: owner.get(f"/api/projects/{project_id}/deployment").json()["status"] == "unhealthy", timeout=10,
               pause=0.02)
    deployment = wait_until(lambda: (d := owner.get(f"/api/projects/{project_id}/deployment").json())["status"] == "running" and d,
                            timeout=60)
    assert deployment["healthy_instances"] == 1
    after = owner.client.get(f"{url}instance")
    assert after.status_code == 200 and after.text != before  # a new process


def test_scaling_spreads_requests_round_robin(owner, served):
    project_id = new_project(owner, app_files("v1"))
    url = deploy(owner, project_id)["url"]
    response = owner.post(f"/api/projects/{project_id}/deployment/scale", json={"instances": 3})
    assert response.status_code == 200, response.text
    assert response.json()["instances"] == 3 and response.json()["healthy_instances"] == 3
    seen = [owner.client.get(f"{url}instance").text for _ in range(9)]
    assert len(set(seen)) == 3 and seen[:3] * 3 == seen
    response = owner.post(f"/api/projects/{project_id}/deployment/scale", json={"instances": 1})
    assert response.json()["healthy_instances"] == 1
    assert len({owner.client.get(f"{url}instance").text for _ in range(4)}) == 1
    assert owner.post(f"/api/projects/{project_id}/deployment/scale", json={"instances": 99}).status_code == 422
    deploys = served.app.state.services.deploys
    deploys.supervisor.max_instances, cap = 1, deploys.supervisor.max_instances
    try:
        refused = owner.post(f"/api/projects/{project_id}/deployment/scale", json={"instances": 2})
    finally:
        deploys.supervisor.max_instances = cap
    assert refused.status_code == 409 and "its maximum is 1" in refused.json()["detail"]
    assert owner.get(f"/api/projects/{project_id}/deployment").json()["instances"] == 1  # unchanged
    assert owner.client.get(f"{url}instance").status_code == 200


def test_stop_then_delete(owner):
    project_id = new_project(owner, app_files("v1"))
    url = deploy(owner, project_id)["url"]
    stopped = owner.post(f"/api/projects/{project_id}/deployment/stop")
    assert stopped.status_code == 200 and stopped.json()["status"] == "stopped"
    assert owner.client.get(url).status_code == 503
    assert owner.delete(f"/api/projects/{project_id}/deployment").status_code == 204
    gone = owner.get(f"/api/projects/{project_id}/deployment")
    assert gone.status_code == 200 and gone.json() is None
    assert owner.client.get(url).status_code == 404


def test_deleting_the_project_stops_its_app(owner, served):
    project_id = new_project(owner, app_files("v1"))
    deployment = deploy(owner, project_id)
    releases = served.app.state.settings.data_dir / "deploy" / "releases"
    [release_dir] = releases.glob(f"*/{deployment['current_release']['id']}")
    assert owner.client.get(deployment["url"]).text == "v1"
    assert owner.delete(f"/api/projects/{project_id}").status_code == 204
    wait_until(lambda: owner.client.get(deployment["url"]).status_code == 404, timeout=20)
    assert not release_dir.parent.exists()


def test_a_request_in_flight_finishes_on_the_old_release(owner, edge):
    project_id = new_project(owner, app_files("v1"))
    url = deploy(owner, project_id)["url"]
    with ThreadPoolExecutor(2) as pool:
        slow = [pool.submit(door.get, f"{url}slow") for door in (owner.client, edge)]
        time.sleep(0.5)  # the slow requests are now being served by v1 (for 6 s)
        write_files(owner, project_id, app_files("v2"))
        assert deploy(owner, project_id)["current_release"]["number"] == 2
        assert owner.client.get(url).text == "v2" == edge.get(url).text
        assert not any(s.done() for s in slow)  # v2 serves while v1 still drains
        answers = [s.result(timeout=30) for s in slow]
    assert [(a.status_code, a.text) for a in answers] == [(200, "slow v1")] * 2
