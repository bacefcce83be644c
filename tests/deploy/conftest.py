"""The real app with deploys on bubblewrap (SQLite), users and projects made through the API, a
shared package cache (Flask, FastAPI and uvicorn install from PyPI once), and a check after every
module that no app process, mount or cgroup is left behind."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sandbox_fixtures  # noqa: F401  (its import gives the session its own CODEYARD_SANDBOX_DIR and the cache dir)
from api_people import Person, sign_up
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sandbox_fixtures import docker_engine, runner_image  # noqa: F401  (fixtures for the Docker tests)

from ide_server.app import create_app
from ide_server.settings import Settings
from sandbox.hosted import UIDS
from sandbox.workspace import processes_of_uid, runs_root

COMPONENTS = [
    "ide_server.api.health:component",
    "ide_server.api.accounts:component",
    "ide_server.api.projects:component",
    "ide_server.api.files:component",
    "collab.api.editing:component",
    "collab.api.history:component",
    "sandbox.api:component",
    "deploy_service.api.secrets:component",
    "deploy_service.api.deployments:component",
]


def packages_dir() -> Path:
    """Kept between test sessions (like pip's cache), so only the first session installs from PyPI."""
    path = Path(os.environ["CODEYARD_CACHE_DIR"]) / "deploy-packages"
    path.mkdir(parents=True, exist_ok=True)
    return path


def make_app(data_dir: Path, database_url: str | None = None, backend: str = "bwrap") -> FastAPI:
    """With the apps' own listener on a free port (app.state.services.apps_edge.port) besides /apps/ on the IDE's."""
    return create_app(Settings(data_dir=data_dir, database_url=database_url or f"sqlite:///{data_dir / 'codeyard.db'}",
                               sandbox_backend=backend, packages_dir=packages_dir(), log_level="warning",
                               deploy_apps_port=0), component_specs=COMPONENTS)


def app_leftovers() -> list[str]:
    """What this session's instances could leave: leased uids (with processes), folders and mounts of
    their workspaces and sockets (runs_root is this session's own, see sandbox_fixtures)."""
    found = [f"app uid {uid} still leased" for uid in UIDS._leases]
    found += [f"process {pid} of app uid {uid}" for uid in UIDS._leases for pid in processes_of_uid(uid)]
    root = runs_root()
    found += [f"folder {p}" for p in os.listdir(root)]
    found += [f"mount {line.split()[4]}" for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(root) in line]
    return found


def serve(data_dir: Path, backend: str = "bwrap") -> Iterator[TestClient]:
    application = make_app(data_dir, backend=backend)
    with TestClient(application) as client:
        yield client
    application.state.engine.dispose()
    deadline = time.monotonic() + 5
    while (found := app_leftovers()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not found, f"left behind after the server stopped: {found[:10]}"


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[TestClient]:
    """A client whose event loop runs the app's lifespan (apps, their supervisors and the proxy live there)."""
    yield from serve(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def edge(served) -> Iterator[httpx.Client]:
    """A client of the apps' own port (the other door to the same apps)."""
    with httpx.Client(base_url=f"http://127.0.0.1:{served.app.state.services.apps_edge.port}", timeout=60) as client:
        yield client


@pytest.fixture
def person(served):
    return lambda: sign_up(served)


@pytest.fixture
def owner(person) -> Person:
    return person()


def new_project(client: Person, files: dict[str, str]) -> str:
    project_id = client.post("/api/projects", json={"name": f"app {secrets.token_hex(3)}"}).json()["id"]
    write_files(client, project_id, files)
    return project_id


def write_files(client: Person, project_id: str, files: dict[str, str]) -> None:
    for path, text in files.items():
        response = client.put(f"/api/projects/{project_id}/files/content/{path}", content=text.encode())
        assert response.status_code in (200, 201), response.text


def add_member(owner: Person, project_id: str, member: Person, role: str) -> None:
    link = owner.post(f"/api/projects/{project_id}/invites", json={"role": role}).json()
    assert member.post(f"/api/invites/{link['token']}/accept").status_code == 200


def wait_release(client: Person, project_id: str, release_id: str, timeout: float = 240) -> dict:
    """The deployment once release_id has gone live or failed."""
    deadline = time.monotonic() + timeout
    while True:
        deployment = client.get(f"/api/projects/{project_id}/deployment").json()
        release = next(r for r in deployment["releases"] if r["id"] == release_id)
        if release["status"] in ("live", "failed") or (release["status"] == "retired" and release["message"]):
            return deployment
        assert time.monotonic() < deadline, f"release still {release['status']}: {deployment}"
        time.sleep(0.1)


def deploy(client: Person, project_id: str, timeout: float = 240) -> dict:
    """POST a deploy and wait for its release to end up live (or failed); returns the deployment."""
    response = client.post(f"/api/projects/{project_id}/deployments")
    assert response.status_code == 202, response.text
    release_id = response.json()["releases"][0]["id"]
    assert response.json()["releases"][0]["status"] == "building"
    return wait_release(client, project_id, release_id, timeout)


