"""After the server restarts, every deployment comes back as it was (on SQLite and PostgreSQL)."""

from __future__ import annotations

from fastapi.testclient import TestClient
from waiting import wait_until

from deploy.conftest import app_leftovers, deploy, make_app, new_project, sign_up

FLASK_APP = 'from flask import Flask\napp = Flask(__name__)\n\n@app.get("/")\ndef home():\n    return "still here"\n'


def test_deployments_come_back_after_a_restart(tmp_path, database_url):
    data_dir = tmp_path / "data"
    first = make_app(data_dir, database_url)
    with TestClient(first) as client:
        owner = sign_up(client)
        running = new_project(owner, {"app.py": FLASK_APP})
        url = deploy(owner, running)["url"]
        assert owner.post(f"/api/projects/{running}/deployment/scale", json={"instances": 2}).json()["healthy_instances"] == 2
        stopped = new_project(owner, {"index.html": "<p>off</p>"})
        stopped_url = deploy(owner, stopped)["url"]
        assert owner.post(f"/api/projects/{stopped}/deployment/stop").json()["status"] == "stopped"
        before = owner.get(f"/api/projects/{running}/deployment").json()
    first.state.engine.dispose()
    assert app_leftovers() == []

    second = make_app(data_dir, database_url)
    with TestClient(second) as client:
        owner.client = client
        after = wait_until(lambda: (d := owner.get(f"/api/projects/{running}/deployment").json())["healthy_instances"] == 2 and d,
                           timeout=60)
        assert after["status"] == "running"
        assert after["current_release"]["id"] == before["current_release"]["id"] and after["url"] == url
        assert {client.get(url).text for _ in range(4)} == {"still here"}
        assert owner.get(f"/api/projects/{stopped}/deployment").json()["status"] == "stopped"
        assert client.get(stopped_url).status_code == 503
    second.state.engine.dispose()
    assert app_leftovers() == []
