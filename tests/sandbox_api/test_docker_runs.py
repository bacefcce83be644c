"""The same API on the Docker backend: a program with input, its verdict, and its files coming back."""

from __future__ import annotations

import time

import pytest
from conftest import COMPONENTS, make_app, new_project, sign_up, wait_finished
from fastapi.testclient import TestClient

from ide_server.app import create_app
from ide_server.settings import Settings


@pytest.fixture(scope="module")
def docker_served(runner_image, tmp_path_factory):
    application = make_app(tmp_path_factory.mktemp("docker-data"), backend="docker")
    with TestClient(application) as client:
        assert application.state.services.runs.backend.name == "docker"
        yield client
    application.state.engine.dispose()


def test_a_run_in_docker(docker_served):
    client = docker_served
    owner = sign_up(client)
    pid = new_project(owner, {"main.py": "n = int(input())\nopen('square.txt', 'w').write(str(n * n))\nprint(n * n)\n"})
    run = wait_finished(owner, owner.post(f"/api/projects/{pid}/runs", json={"stdin": "12\n"}).json()["id"], timeout=60)
    assert (run["verdict"], run["stdout"], run["files_written"]) == ("ok", "144\n", ["square.txt"]), run
    assert owner.get(f"/api/projects/{pid}/files/content/square.txt").text == "144"


def test_runs_take_warm_containers_and_the_pool_goes_with_the_server(docker_engine, runner_image, tmp_path):
    """CODEYARD_SANDBOX_WARM_CONTAINERS: idle containers wait for runs with the default limits; a run
    takes one (it is not reused), and stopping the server removes the rest."""
    from sandbox.backends.docker import POOL_LABEL

    def pool(**filters) -> set[str]:  # the low-level list: no inspect of a container being removed
        return {c["Id"] for c in docker_engine.api.containers(all=True, filters={"label": POOL_LABEL, **filters})}

    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'codeyard.db'}", sandbox_backend="docker",
                        sandbox_warm_containers=2, log_level="warning")
    application = create_app(settings, component_specs=COMPONENTS)
    with TestClient(application) as client:
        deadline = time.monotonic() + 60
        while len(waiting := pool(status="running")) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(waiting) == 2
        time.sleep(0.5)  # a started container joins the pool as its start call returns
        owner = sign_up(client)
        pid = new_project(owner, {"main.py": "print(6 * 7)\n"})
        run = wait_finished(owner, owner.post(f"/api/projects/{pid}/runs", json={}).json()["id"], timeout=60)
        assert (run["verdict"], run["stdout"]) == ("ok", "42\n"), run
        deadline = time.monotonic() + 30  # the used container is removed in the background
        while not (waiting - pool()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert waiting - pool(), "the run did not take a waiting container"
    application.state.engine.dispose()
    assert not pool()
