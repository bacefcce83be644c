"""The same API on the Docker backend: a program with input, its verdict, and its files coming back."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from conftest import Person, make_app, new_project, wait_finished


@pytest.fixture(scope="module")
def docker_served(runner_image, tmp_path_factory):
    application = make_app(tmp_path_factory.mktemp("docker-data"), backend="docker")
    with TestClient(application) as client:
        assert application.state.sandbox_runs.backend.name == "docker"
        yield client
    application.state.engine.dispose()


def test_a_run_in_docker(docker_served):
    client = docker_served
    csrf = client.post("/api/auth/register", json={"username": "docker-user", "password": "pass-word-1"}).json()["csrf_token"]
    token = client.post("/api/tokens", json={"name": "t"}, headers={"X-CSRF-Token": csrf}).json()["token"]
    client.cookies.clear()
    owner = Person(client, token)
    pid = new_project(owner, {"main.py": "n = int(input())\nopen('square.txt', 'w').write(str(n * n))\nprint(n * n)\n"})
    run = wait_finished(owner, owner.post(f"/api/projects/{pid}/runs", json={"stdin": "12\n"}).json()["id"], timeout=60)
    assert (run["verdict"], run["stdout"], run["files_written"]) == ("ok", "144\n", ["square.txt"]), run
    assert owner.get(f"/api/projects/{pid}/files/content/square.txt").text == "144"
