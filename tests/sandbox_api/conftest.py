"""The real app with the sandbox and collab components on the bubblewrap backend (SQLite), users
and projects made through the API, and the shared sandbox fixtures (nothing left behind)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import pytest
from api_people import Person, sign_up
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sandbox_fixtures import *  # noqa: F401,F403
from sandbox_fixtures import TEST_LIMITS, leftovers, make_spec  # noqa: F401

from ide_server.app import create_app
from ide_server.settings import Settings

COMPONENTS = [
    "ide_server.api.health:component",
    "ide_server.api.accounts:component",
    "ide_server.api.projects:component",
    "ide_server.api.files:component",
    "collab.api.editing:component",
    "ide_server.api.events:component",
    "collab.api.history:component",
    "sandbox.api:component",
]


def make_app(data_dir, backend: str = "bwrap", components: list[str] = COMPONENTS) -> FastAPI:
    return create_app(Settings(data_dir=data_dir, database_url=f"sqlite:///{data_dir / 'codeyard.db'}",
                               sandbox_backend=backend, log_level="warning"), component_specs=components)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[TestClient]:
    """A client whose event loop runs the app's lifespan: every request must go through it, since
    runs are tasks on that loop (a bare TestClient would run each request on a loop of its own)."""
    application = make_app(tmp_path_factory.mktemp("data"))
    with TestClient(application) as client:
        yield client
    application.state.engine.dispose()


@pytest.fixture(scope="module")
def app(served) -> FastAPI:
    return served.app


@pytest.fixture
def person(served):
    """Factory: a new signed-in user (Bearer token; the shared client keeps no cookies)."""

    return lambda: sign_up(served)


@pytest.fixture
def owner(person) -> Person:
    return person()


@pytest.fixture
def anon(served) -> Person:
    return Person(served, None)


def new_project(client: Person, files: dict[str, str]) -> str:
    project_id = client.post("/api/projects", json={"name": f"p{secrets.token_hex(3)}"}).json()["id"]
    for path, text in files.items():
        assert client.put(f"/api/projects/{project_id}/files/content/{path}", content=text.encode()).status_code in (200, 201)
    return project_id


def add_member(owner: Person, project_id: str, member: Person, role: str) -> None:
    link = owner.post(f"/api/projects/{project_id}/invites", json={"role": role}).json()
    assert member.post(f"/api/invites/{link['token']}/accept").status_code == 200


def wait_finished(client: Person, run_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = client.get(f"/api/runs/{run_id}").json()
        if run["status"] == "finished" or time.monotonic() > deadline:
            return run
        time.sleep(0.05)
