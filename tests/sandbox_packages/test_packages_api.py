"""Packages through the API: a run installs what it imports first (install frames on its socket),
unknown imports get a clear message, and POST /api/projects/{id}/packages installs named packages."""

from __future__ import annotations

import secrets

import pytest
from api_people import sign_up
from fastapi.testclient import TestClient

from ide_server.app import create_app
from ide_server.settings import Settings

COMPONENTS = ["ide_server.api.health:component", "ide_server.api.accounts:component", "ide_server.api.projects:component",
              "ide_server.api.files:component", "sandbox.api:component"]


@pytest.fixture(scope="module")
def client(tmp_path_factory, packages_root) -> TestClient:
    data = tmp_path_factory.mktemp("data")
    app = create_app(Settings(data_dir=data, database_url=f"sqlite:///{data / 'codeyard.db'}", sandbox_backend="bwrap",
                              packages_dir=packages_root, log_level="warning"), component_specs=COMPONENTS)
    with TestClient(app) as served:
        yield served
    app.state.engine.dispose()


def sign_in(client: TestClient) -> dict[str, str]:
    return {"Authorization": f"Bearer {sign_up(client).token}"}


def new_project(client: TestClient, auth: dict, files: dict[str, str]) -> str:
    project_id = client.post("/api/projects", json={"name": f"p{secrets.token_hex(3)}"}, headers=auth).json()["id"]
    for path, text in files.items():
        client.put(f"/api/projects/{project_id}/files/content/{path}", content=text.encode(), headers=auth).raise_for_status()
    return project_id


def run_and_follow(client: TestClient, auth: dict, project_id: str, **body) -> tuple[list[dict], dict]:
    """Start a run and read its socket to the end: (frames before exit, the exit frame)."""
    run = client.post(f"/api/projects/{project_id}/runs", json=body, headers=auth)
    assert run.status_code == 202, run.text
    frames = []
    with client.websocket_connect(f"/ws/runs/{run.json()['id']}", headers=auth) as socket:
        while (frame := socket.receive_json())["type"] != "exit":
            frames.append(frame)
    return frames, frame


def text(frames: list[dict], kind: str) -> str:
    return "".join(f["data"] for f in frames if f["type"] == kind)


def test_a_run_installs_its_imports_first_then_uses_the_cache(client):
    auth = sign_in(client)
    project_id = new_project(client, auth, {"main.py": "import six\nprint('six', six.__version__)\n"})
    frames, end = run_and_follow(client, auth, project_id)
    assert "Successfully installed six-" in text(frames, "install")
    pinned = client.get(f"/api/projects/{project_id}/files/content/requirements.txt", headers=auth).text
    assert end["verdict"] == "ok" and text(frames, "stdout") == f"six {pinned.strip().removeprefix('six==')}\n", end

    frames, end = run_and_follow(client, auth, project_id)
    assert end["verdict"] == "ok" and [f for f in frames if f["type"] == "install"] == []


def test_unknown_import_gets_a_clear_message(client):
    auth = sign_in(client)
    project_id = new_project(client, auth, {"main.py": "import codeyard_nonesuch\n"})
    frames, end = run_and_follow(client, auth, project_id)
    assert end["verdict"] == "runtime_error"
    assert "No package is known for import 'codeyard_nonesuch'" in end["message"]
    assert f"POST /api/projects/{project_id}/packages" in end["message"]
    assert [f for f in frames if f["type"] == "install"] == []


@pytest.mark.parametrize("names", [["--index-url=https://evil.example/simple"], ["git+https://evil.example/x.git"],
                                   ["../../etc"], ["six==1.0"], ["six", "six; rm -rf /"]])
def test_bad_package_names_are_refused(client, names):
    auth = sign_in(client)
    project_id = new_project(client, auth, {"main.py": "print(1)\n"})
    answer = client.post(f"/api/projects/{project_id}/packages", json={"names": names}, headers=auth)
    assert answer.status_code == 400 and "names: give package names only" in answer.json()["detail"], answer.text
    assert client.get(f"/api/projects/{project_id}/files/content/requirements.txt", headers=auth).status_code == 404


def test_one_click_install_adds_pinned_names(client):
    auth = sign_in(client)
    project_id = new_project(client, auth, {"main.py": "import six\n"})
    answer = client.post(f"/api/projects/{project_id}/packages", json={"names": ["six"]}, headers=auth)
    assert answer.status_code == 200, answer.text
    version = answer.json()["installed"]["six"]
    assert answer.json()["requirements"] == [f"six=={version}"]
    viewer_less = sign_in(client)
    assert client.post(f"/api/projects/{project_id}/packages", json={"names": ["six"]}, headers=viewer_less).status_code == 404


def test_a_node_run_installs_its_requires_first(client):
    auth = sign_in(client)
    project_id = new_project(client, auth, {"index.js": "const ms = require('ms');\nconsole.log(ms('1m'));\n"})
    frames, end = run_and_follow(client, auth, project_id, entry="index.js")
    assert "added 1 package" in text(frames, "install")
    assert end["verdict"] == "ok" and text(frames, "stdout") == "60000\n", end


@pytest.fixture(scope="module")
def docker_client_app(tmp_path_factory, packages_root, runner_image) -> TestClient:
    """The same server on the Docker backend (installs still run under bubblewrap; runs mount the environment)."""
    data = tmp_path_factory.mktemp("docker-data")
    app = create_app(Settings(data_dir=data, database_url=f"sqlite:///{data / 'codeyard.db'}", sandbox_backend="docker",
                              packages_dir=packages_root, log_level="warning"), component_specs=COMPONENTS)
    with TestClient(app) as served:
        assert app.state.services.runs.backend.name == "docker"
        yield served
    app.state.engine.dispose()


def test_packages_work_with_the_docker_backend(docker_client_app):
    client = docker_client_app
    auth = sign_in(client)
    code = ("import requests\nprint(requests.__version__, requests.__file__)\n"
            "print([line.split()[5][:2] for line in open('/proc/self/mountinfo') if line.split()[4] == '/packages'])\n")
    project_id = new_project(client, auth, {"main.py": code})
    frames, end = run_and_follow(client, auth, project_id)
    assert "Successfully installed" in text(frames, "install")
    pins = client.get(f"/api/projects/{project_id}/files/content/requirements.txt", headers=auth).text
    version = pins.strip().removeprefix("requests==")
    assert end["verdict"] == "ok", (end, text(frames, "install"))
    assert text(frames, "stdout") == f"{version} /packages/requests/__init__.py\n['ro']\n"  # mounted read-only

    node = new_project(client, auth, {"index.js": "const ms = require('ms');\nconsole.log(ms('1m'));\n"})
    frames, end = run_and_follow(client, auth, node, entry="index.js")
    assert end["verdict"] == "ok" and text(frames, "stdout") == "60000\n", (end, frames)
