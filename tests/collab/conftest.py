"""Fixtures for the collab tests: database URLs (SQLite and the suite's PostgreSQL), servers, clients."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from collab.store import CollabBase, UpdateStore
from collab_testkit import CollabServer, JsClients, ensure_node_modules


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'collab.db'}"
    url = os.environ.get("CODEYARD_TEST_POSTGRES_URL")
    if not url:
        pytest.fail("CODEYARD_TEST_POSTGRES_URL is not set: run the tests through scripts/run-tests.sh")
    return url


@pytest.fixture
def store(db_url: str):
    engine = create_engine(db_url)
    CollabBase.metadata.create_all(engine)
    yield UpdateStore(engine)
    engine.dispose()


@pytest.fixture
def redis_url() -> str:
    url = os.environ.get("CODEYARD_TEST_REDIS_URL")
    if not url:
        pytest.fail("CODEYARD_TEST_REDIS_URL is not set: run the tests through scripts/run-tests.sh")
    return url


@pytest.fixture
def project_id() -> str:
    """A fresh project id per test, so tests sharing the PostgreSQL database never share rooms."""
    return f"p{uuid.uuid4().hex[:12]}"


@pytest.fixture
def project_root(tmp_path: Path, project_id: str) -> Path:
    root = tmp_path / "projects"
    (root / project_id).mkdir(parents=True)
    return root


@pytest.fixture(scope="session")
def node_modules() -> None:
    ensure_node_modules()


@pytest.fixture
def server(db_url: str, project_root: Path, tmp_path: Path):
    srv = CollabServer(db_url, project_root, tmp_path / "server.log")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def js(server: CollabServer, node_modules: None):
    clients = JsClients(server.ws_url)
    yield clients
    clients.close()
