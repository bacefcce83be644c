"""The real app with the sandbox and collab components on the bubblewrap backend (SQLite), users
and projects made through the API, and the shared sandbox fixtures (nothing left behind)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import pytest
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
    "collab.component:component",
    "collab.history_api:component",
    "sandbox.component:component",
]


def make_app(data_dir, backend: str = "bwrap") -> FastAPI:
    return create_app(Settings(data_dir=data_dir, database_url=f"sqlite:///{data_dir / 'codeyard.db'}",
                               sandbox_backend=backend, log_level="warning"), component_specs=COMPONENTS)


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


class Person:
    """A signed-in user: requests through the served client with the user's Bearer token."""

    def __init__(self, client: TestClient, token: str | None) -> None:
        self.client, self.token = client, token

    def _headers(self, kwargs: dict) -> dict:
        return {**kwargs.pop("headers", {}), **({"Authorization": f"Bearer {self.token}"} if self.token else {})}

    def request(self, method: str, url: str, **kwargs):
        return self.client.request(method, url, headers=self._headers(kwargs), **kwargs)

    def get(self, url: str, **kwargs):
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs):
        return self.request("POST", url, **kwargs)

    def put(self, url: str, **kwargs):
        return self.request("PUT", url, **kwargs)

    def websocket_connect(self, url: str, **kwargs):
        return self.client.websocket_connect(url, headers=self._headers(kwargs), **kwargs)


@pytest.fixture
def person(served):
    """Factory: a new signed-in user (Bearer token; the shared client keeps no cookies)."""

    def make() -> Person:
        csrf = served.post("/api/auth/register", json={"username": f"u{secrets.token_hex(4)}",
                                                        "password": "pass-word-1"}).json()["csrf_token"]
        token = served.post("/api/tokens", json={"name": "t"}, headers={"X-CSRF-Token": csrf}).json()["token"]
        served.cookies.clear()
        return Person(served, token)

    return make


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
