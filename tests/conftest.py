"""Shared fixtures: a Codeyard app on SQLite and on PostgreSQL, and signed-in test users.

Every test that uses `app` (or `settings`/`database_url`) runs twice: once on a SQLite file and
once on a fresh PostgreSQL database (from CODEYARD_TEST_POSTGRES_URL, which
scripts/run-tests.sh sets). Each test module gets its own database and data dir.
"""

import os
import secrets
from collections.abc import Iterator

import pytest
from argon2 import PasswordHasher
from argon2.profiles import CHEAPEST
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, make_url, text

from ide_server import security
from ide_server.app import create_app
from ide_server.settings import Settings

PASSWORD = "correct horse battery"

# Apps made here (and the servers they start) load the LLM on first use, not at start-up: most tests
# never ask it, and each load is a minute of CPU. The tests of the eager load set it to 1 themselves.
os.environ.setdefault("CODEYARD_LLM_EAGER", "0")


def postgres_base_url() -> str:
    url = os.environ.get("CODEYARD_TEST_POSTGRES_URL")
    if not url:
        pytest.fail(
            "CODEYARD_TEST_POSTGRES_URL is not set: run the tests with `make test` or "
            "`bash scripts/run-tests.sh ...`, which start PostgreSQL and set it",
            pytrace=False,
        )
    return url


@pytest.fixture(scope="session", autouse=True)
def cheap_password_hashing():
    """Argon2 with its cheapest parameters: the real algorithm, without ~0.3 s per hash.
    (tests/ide_server/test_accounts.py checks the production parameters separately.)"""
    original = security._hasher
    security._hasher = PasswordHasher.from_parameters(CHEAPEST)
    yield
    security._hasher = original


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def db_backend(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def database_url(db_backend, tmp_path_factory) -> Iterator[str]:
    """A fresh, empty database for one test module."""
    if db_backend == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'codeyard.db'}"
        return
    base = make_url(postgres_base_url())
    name = f"codeyard_t_{secrets.token_hex(5)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="module")
def settings(database_url, tmp_path_factory) -> Settings:
    return Settings(
        data_dir=tmp_path_factory.mktemp("data"),
        database_url=database_url,
        login_max_failures=3,
        login_window_seconds=60,
        max_file_bytes=2 * 1024 * 1024,
        max_upload_bytes=4 * 1024 * 1024,
    )


@pytest.fixture(scope="module")
def app(settings) -> Iterator[FastAPI]:
    """The app with its lifespan running for the whole module."""
    application = create_app(settings)
    with TestClient(application):
        yield application
    application.state.engine.dispose()


class UserClient(TestClient):
    """A TestClient signed in as `username` with a session cookie; sends the CSRF header itself."""

    username: str
    password: str


@pytest.fixture
def new_user(app):
    """Factory: new_user() -> UserClient of a freshly registered user (unique name)."""

    def make(username: str | None = None) -> UserClient:
        name = username or f"u{secrets.token_hex(4)}"
        client = UserClient(app)
        response = client.post("/api/auth/register", json={"username": name, "password": PASSWORD})
        assert response.status_code == 201, response.text
        client.headers["X-CSRF-Token"] = response.json()["csrf_token"]
        client.username = name
        client.password = PASSWORD
        return client

    return make


@pytest.fixture
def anon(app) -> TestClient:
    return TestClient(app)
