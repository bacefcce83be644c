"""Deploys on the Docker backend (the runs' hardened containers, network "none"), through the same proxy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from deploy.conftest import deploy, new_project, serve
from deploy.test_app_kinds import FASTAPI_APP, FLASK_APP, NODE_PACKAGE, NODE_SERVER, STATIC
from sandbox.backends.docker import LABEL


@pytest.fixture(scope="module")
def served(runner_image, tmp_path_factory) -> Iterator[TestClient]:
    yield from serve(tmp_path_factory.mktemp("data"), backend="docker")


def test_flask_fastapi_node_and_static_apps_run_in_containers(owner, served, docker_engine):
    assert served.app.state.services.deploys.backend.name == "docker"
    flask_project = new_project(owner, {"app.py": FLASK_APP})
    flask = deploy(owner, flask_project)
    assert flask["status"] == "running", flask["releases"][0]["message"]
    assert owner.client.get(flask["url"]).text == "Hello from Flask"
    fastapi_project = new_project(owner, {"main.py": FASTAPI_APP})
    fastapi = deploy(owner, fastapi_project)
    assert fastapi["status"] == "running", fastapi["releases"][0]["message"]
    with owner.client.websocket_connect(f"{fastapi['url']}ws") as websocket:
        websocket.send_text("contained")
        assert websocket.receive_text() == "CONTAINED"
    node_project = new_project(owner, {"package.json": NODE_PACKAGE, "server.js": NODE_SERVER})
    node = deploy(owner, node_project)
    assert owner.client.get(f"{node['url']}x").text == "Hello from Node at /x after 1m", node["releases"][0]["message"]
    static_project = new_project(owner, STATIC)
    static = deploy(owner, static_project)
    assert "Hello from a static site" in owner.client.get(static["url"]).text, static["releases"][0]["message"]
    containers = docker_engine.containers.list(filters={"label": LABEL})
    config = [c for c in containers if c.attrs["HostConfig"]["NetworkMode"] == "none" and "-c" in c.attrs["Config"]["Cmd"]]
    assert len(config) >= 4
    for project_id in (flask_project, fastapi_project, node_project, static_project):
        assert owner.delete(f"/api/projects/{project_id}/deployment").status_code == 204
    remaining = {c.id for c in docker_engine.containers.list(all=True, filters={"label": LABEL})}
    assert not remaining & {c.id for c in config}
