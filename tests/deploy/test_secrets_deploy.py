"""A deployed app (and its build) gets the project's secrets, while their values appear in no API
answer, deploy log (kept or streamed), server log record or file under the data dir."""

from __future__ import annotations

import hashlib
import logging
import secrets

from deploy.conftest import deploy, new_project

SERVER = """\
import hashlib, os
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = hashlib.sha256(os.environ.get("API_KEY", "").encode()).hexdigest().encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

print("serving; API_KEY set:", "API_KEY" in os.environ, flush=True)
HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
"""
CONFIG = """\
[deploy]
build = ["python3", "-c", "import os; print('build sees API_KEY:', 'API_KEY' in os.environ)"]
run = ["python3", "server.py"]
"""


def test_deploys_get_secrets_that_never_show_anywhere(owner, served, caplog):
    caplog.set_level(logging.DEBUG)
    value = f"sv-{secrets.token_hex(12)}"
    project_id = new_project(owner, {"server.py": SERVER, "codeyard.toml": CONFIG})
    answers = [owner.put(f"/api/projects/{project_id}/secrets/API_KEY", json={"value": value})]
    assert answers[0].status_code == 201
    deployment = deploy(owner, project_id)
    assert deployment["status"] == "running", deployment["releases"][0]["message"]
    page = owner.client.get(deployment["url"])
    assert page.text == hashlib.sha256(value.encode()).hexdigest()  # the app has the value, and did not print it
    answers += [page, owner.get(f"/api/projects/{project_id}/deployment"), owner.get(f"/api/projects/{project_id}/secrets")]

    with owner.websocket_connect(f"/ws/projects/{project_id}/deployment/logs") as socket:
        frames: list[dict] = []
        while "API_KEY set: True" not in (text := "".join(f["data"] for f in frames)):  # output comes in pieces
            frames.append(socket.receive_json())
    assert "build sees API_KEY: True" in text, text
    assert value not in repr(frames)

    for answer in answers:
        assert value not in answer.text
    for record in caplog.records:
        assert value not in record.getMessage() and value not in repr(record.__dict__)
    data_dir = served.app.state.settings.data_dir
    holding = [str(p) for p in data_dir.rglob("*") if p.is_file() and value.encode() in p.read_bytes()]
    assert holding == []
