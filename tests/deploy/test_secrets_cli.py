"""`codeyard secrets reseal`: after the server key changes, secrets sealed under the old key are
re-sealed under the new one; ones no key opens are named (exit 2), and values are never printed."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from deploy_service.secret_box import SecretBox
from deploy_service.secret_models import ProjectSecret
from deploy_service.secrets import ProjectSecrets
from ide_server import db
from ide_server.app import create_app
from ide_server.cli import main
from ide_server.settings import Settings

OLD_KEY, NEW_KEY = "the old server key", "the new server key"
COMPONENTS = ["ide_server.api.accounts:component", "ide_server.api.projects:component",
              "deploy_service.api.secrets:component"]


def codeyard(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    out, err = capsys.readouterr()
    return exited.value.code, out, err


def sealed_under(url: str, key: str, project_id: str) -> dict[str, str]:
    engine = db.make_engine(url)
    try:
        with db.make_sessionmaker(engine)() as session:
            return ProjectSecrets(SecretBox(key)).environment_for(session, project_id)
    finally:
        engine.dispose()


def test_reseal_after_the_server_key_changed(tmp_path, monkeypatch, capsys):
    data_dir = tmp_path / "data"
    url = f"sqlite:///{data_dir / 'codeyard.db'}"
    app = create_app(Settings(data_dir=data_dir, secret_key=OLD_KEY, log_level="warning"), component_specs=COMPONENTS)
    with TestClient(app) as client:
        client.headers["X-CSRF-Token"] = client.post(
            "/api/auth/register", json={"username": "keeper", "password": "pass-word-1"}).json()["csrf_token"]
        pid = client.post("/api/projects", json={"name": "p"}).json()["id"]
        assert client.put(f"/api/projects/{pid}/secrets/API_KEY", json={"value": "value-one"}).status_code == 201
    app.state.engine.dispose()
    old_key_file = tmp_path / "old.key"
    old_key_file.write_text(OLD_KEY + "\n")
    monkeypatch.setenv("CODEYARD_DATA_DIR", str(data_dir))
    monkeypatch.setenv("CODEYARD_SECRET_KEY", NEW_KEY)

    assert codeyard(capsys, "secrets", "reseal", "--old-key-file", str(old_key_file))[:2] == (
        0, "re-sealed 1 secret under the current key\n")
    assert sealed_under(url, NEW_KEY, pid) == {"API_KEY": "value-one"}
    assert codeyard(capsys, "secrets", "reseal", "--old-key-file", str(old_key_file))[:2] == (
        0, "re-sealed 0 secrets under the current key\n")  # already done: nothing to do

    engine = db.make_engine(url)
    with db.make_sessionmaker(engine)() as session:  # a secret sealed under a key nobody has any more
        session.add(ProjectSecret(project_id=pid, name="LOST", sealed=SecretBox("gone").seal("value-two", pid, "LOST")))
        session.commit()
    engine.dispose()
    code, out, err = codeyard(capsys, "secrets", "reseal", "--old-key-file", str(old_key_file))
    assert code == 2 and err == f"codeyard: error: 1 secret(s) open with neither key; set them again: {pid}/LOST\n"
    assert "value-" not in out + err

    old_key_file.write_text("\n")
    code, _, err = codeyard(capsys, "secrets", "reseal", "--old-key-file", str(old_key_file))
    assert code == 2 and err == f"codeyard: error: old_key_file: {old_key_file} is empty\n"
    code, _, err = codeyard(capsys, "secrets", "reseal", "--old-key-file", str(tmp_path / "missing.key"))
    assert code == 2 and err.startswith("codeyard: error: ") and err.count("\n") == 1
