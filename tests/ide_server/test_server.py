"""Settings, secret key, database and migrations, health probes, and the real server's JSON logs."""

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient
from sqlalchemy import text

from ide_server import db
from ide_server.app import create_app
from ide_server.models import Base
from ide_server.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def test_secret_key_is_generated_once_with_mode_0600(tmp_path):
    first = Settings(data_dir=tmp_path).prepare()
    key_file = tmp_path / "secret_key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert len(first.secret_key.get_secret_value()) >= 60
    assert Settings(data_dir=tmp_path).prepare().secret_key == first.secret_key
    assert first.secret_key.get_secret_value() not in repr(first)


def test_an_empty_secret_key_file_is_a_clear_error(tmp_path):
    (tmp_path / "secret_key").write_text("")
    with pytest.raises(ValueError, match="secret key file .* is empty"):
        Settings(data_dir=tmp_path).prepare()


def test_settings_come_from_codeyard_environment_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("CODEYARD_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CODEYARD_SANDBOX_BACKEND", "bwrap")
    monkeypatch.setenv("CODEYARD_REDIS_URL", "redis://example:6379/0")
    settings = Settings()
    assert settings.data_dir == tmp_path and settings.sandbox_backend == "bwrap"
    assert settings.redis_url == "redis://example:6379/0"
    assert settings.effective_database_url == f"sqlite:///{tmp_path.resolve()}/codeyard.db"


def test_schema_is_migrated_to_head_and_matches_the_models(app):
    db.load_models()
    engine = app.state.engine
    assert db.current_revision(engine) == db.head_revision()
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        if engine.dialect.name == "sqlite":
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"


def test_health_probes(app):
    client = TestClient(app)
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["schema"] == db.head_revision()
    assert client.get("/api/openapi.json").json()["info"]["title"] == "Codeyard"
    docs = client.get("/api/docs")
    assert docs.status_code == 200 and "/api/openapi.json" in docs.text


def test_readyz_fails_when_the_schema_is_behind(tmp_path):
    app = create_app(Settings(data_dir=tmp_path))
    from alembic import command

    command.downgrade(db.alembic_config(app.state.engine.url.render_as_string(False)), "base")
    response = TestClient(app).get("/readyz")
    assert response.status_code == 503
    assert "expected" in response.json()["detail"]


def test_migrations_run_with_the_alembic_command(tmp_path):
    env = {**os.environ, "CODEYARD_DATA_DIR": str(tmp_path)}
    alembic = [sys.executable, "-m", "alembic", "-c", str(REPO / "ide_server/migrations/alembic.ini")]
    subprocess.run([*alembic, "upgrade", "head"], env=env, check=True, capture_output=True, timeout=60)
    current = subprocess.run([*alembic, "current"], env=env, check=True, capture_output=True, text=True, timeout=60)
    assert f"{db.head_revision()} (head)" in current.stdout


def test_validation_errors_are_422_with_a_readable_message(anon):
    response = anon.post("/api/auth/login", json={"username": ""})
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert "body.username: String should have at least 1 character" in detail
    assert "body.password: Field required" in detail


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_codeyard_serve_answers_and_logs_json_without_secrets(tmp_path):
    port = _free_port()
    codeyard = Path(sys.executable).parent / "codeyard"
    server = subprocess.Popen(
        [str(codeyard), "serve", "--port", str(port), "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60  # ~2 s when idle; 12 s was seen on a loaded 2-core machine
        while True:
            try:
                if httpx.get(f"{base}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail("the server did not become ready")
                time.sleep(0.1)
        with httpx.Client(base_url=base) as client:
            login = client.post("/api/auth/register", json={"username": "logged", "password": "very-secret-pw"})
            assert login.status_code == 201
            assert client.get("/api/me?access_token=query-secret").status_code == 200
            headers = {"X-CSRF-Token": login.json()["csrf_token"]}
            pid = client.post("/api/projects", json={"name": "p"}, headers=headers).json()["id"]
            invite = client.post(f"/api/projects/{pid}/invites", json={}, headers=headers).json()["token"]
            assert client.post(f"/api/invites/{invite}/accept", headers=headers).status_code == 200
        assert httpx.get(f"{base}/api/openapi.json").json()["info"]["title"] == "Codeyard"
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=20)
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    requests = [r for r in lines if r.get("event") == "request"]
    assert {"method": "GET", "path": "/api/me", "status": 200} in [
        {k: r[k] for k in ("method", "path", "status")} for r in requests
    ]
    assert all(isinstance(r["duration_ms"], float) for r in requests)
    accept = next(r for r in requests if r["path"].endswith("/accept"))
    assert accept["path"] == "/api/invites/***/accept" and accept["route"] == "/api/invites/{token}/accept"
    secret = (tmp_path / "secret_key").read_text().strip()
    session = login.cookies["codeyard_session"]
    for leaked in (secret, session, login.json()["csrf_token"], "very-secret-pw", "query-secret", invite):
        assert leaked not in stderr
