"""Secrets reach a project's runs (real bubblewrap sandbox) only when its owner allows it."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sandbox_fixtures import *  # noqa: F401,F403  (the "nothing left behind" check)

from ide_server.app import create_app
from ide_server.settings import Settings

COMPONENTS = [
    "ide_server.api.accounts:component",
    "ide_server.api.projects:component",
    "ide_server.api.files:component",
    "sandbox.api:component",
    "deploy_service.api.secrets:component",
]
PROGRAM = "import os\nprint('API_KEY=' + os.environ.get('API_KEY', '<unset>'))\n"


@pytest.fixture(scope="module")
def owner(tmp_path_factory) -> Iterator[TestClient]:
    """The owner's client on an app whose lifespan runs for the module (runs are tasks on its loop)."""
    data_dir = tmp_path_factory.mktemp("data")
    app = create_app(Settings(data_dir=data_dir, database_url=f"sqlite:///{data_dir / 'codeyard.db'}",
                              sandbox_backend="bwrap", log_level="warning"), component_specs=COMPONENTS)
    with TestClient(app) as client:
        csrf = client.post("/api/auth/register", json={"username": f"u{secrets.token_hex(4)}",
                                                        "password": "pass-word-1"}).json()["csrf_token"]
        client.headers["X-CSRF-Token"] = csrf
        yield client
    app.state.engine.dispose()


def run_output(client: TestClient, project_id: str) -> str:
    run_id = client.post(f"/api/projects/{project_id}/runs", json={}).json()["id"]
    deadline = time.monotonic() + 60
    while (run := client.get(f"/api/runs/{run_id}").json())["status"] != "finished":
        assert time.monotonic() < deadline, run
        time.sleep(0.05)
    assert run["verdict"] == "ok", run
    return run["stdout"]


def test_runs_get_secrets_only_after_the_owner_allows_it(owner):
    pid = owner.post("/api/projects", json={"name": "env"}).json()["id"]
    other = owner.post("/api/projects", json={"name": "other"}).json()["id"]
    for project_id in (pid, other):
        assert owner.put(f"/api/projects/{project_id}/files/content/main.py", content=PROGRAM.encode()).status_code in (200, 201)
    value = f"sv-{secrets.token_hex(8)}"
    assert owner.put(f"/api/projects/{pid}/secrets/API_KEY", json={"value": value}).status_code == 201
    assert run_output(owner, pid) == "API_KEY=<unset>\n"
    assert owner.patch(f"/api/projects/{pid}/secrets", json={"expose_to_runs": True}).status_code == 200
    assert run_output(owner, pid) == f"API_KEY={value}\n"
    assert run_output(owner, other) == "API_KEY=<unset>\n"  # another project of the same owner gets nothing


def host_command_lines() -> list[bytes]:
    lines = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                lines.append((proc / "cmdline").read_bytes())
            except OSError:
                pass  # ended meanwhile
    return lines


def test_secret_values_stay_off_host_command_lines(owner):
    pid = owner.post("/api/projects", json={"name": "cmdline"}).json()["id"]
    program = "import os, time\nprint('has key:', 'API_KEY' in os.environ, flush=True)\ntime.sleep(30)\n"
    owner.put(f"/api/projects/{pid}/files/content/main.py", content=program.encode()).raise_for_status()
    value = f"sv-{secrets.token_hex(8)}"
    owner.put(f"/api/projects/{pid}/secrets/API_KEY", json={"value": value}).raise_for_status()
    owner.patch(f"/api/projects/{pid}/secrets", json={"expose_to_runs": True}).raise_for_status()
    run_id = owner.post(f"/api/projects/{pid}/runs", json={}).json()["id"]
    try:
        deadline = time.monotonic() + 30
        while "has key: True" not in owner.get(f"/api/runs/{run_id}").json()["stdout"]:
            assert time.monotonic() < deadline, owner.get(f"/api/runs/{run_id}").json()
            time.sleep(0.05)
        command_lines = host_command_lines()
        assert any(b"bwrap" in line for line in command_lines)  # the sandbox is up while we look
        assert not [line for line in command_lines if value.encode() in line]
    finally:
        owner.post(f"/api/runs/{run_id}/cancel")
        deadline = time.monotonic() + 30
        while owner.get(f"/api/runs/{run_id}").json()["status"] != "finished" and time.monotonic() < deadline:
            time.sleep(0.05)
