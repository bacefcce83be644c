"""Fixtures for the collab tests: migrated databases (SQLite, and PostgreSQL from the suite's server), servers, clients."""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from collab_testkit import CollabServer, JsClients, ensure_node_modules
from sqlalchemy import create_engine, make_url, text

from collab.store import UpdateStore
from ide_server.db import make_engine, migrate


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this session's collab tests, migrated to head once."""
    base = os.environ.get("CODEYARD_TEST_POSTGRES_URL")
    if not base:
        pytest.fail("CODEYARD_TEST_POSTGRES_URL is not set: run the tests through scripts/run-tests.sh")
    name = f"codeyard_collab_{secrets.token_hex(5)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(base).set(database=name).render_as_string(hide_password=False)
    _migrate(url)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path: Path) -> str:
    """A database at the app's schema head (the same migrations as production)."""
    if request.param == "postgres":
        return request.getfixturevalue("postgres_url")
    url = f"sqlite:///{tmp_path / 'collab.db'}"
    _migrate(url)
    return url


def _migrate(url: str) -> None:
    engine = make_engine(url)
    migrate(engine)
    engine.dispose()


@pytest.fixture
def store(db_url: str):
    engine = create_engine(db_url)
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
def app_server(db_url: str, tmp_path: Path):
    """The real ide_server app (accounts, projects, files, events, collab, history) under uvicorn."""
    srv = CollabServer(
        db_url, tmp_path, tmp_path / "app.log", app="collab_app_factory:create",
        extra_env={"CODEYARD_DATA_DIR": str(tmp_path / "data"), "CODEYARD_DATABASE_URL": db_url},
    )
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def js(server: CollabServer, node_modules: None):
    clients = JsClients(server.ws_url)
    yield clients
    clients.close()
