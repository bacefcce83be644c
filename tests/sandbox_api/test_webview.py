"""The Webview: a web app started with Run is reached through /preview/{token}/ (HTTP and WebSocket), only by
those who may watch the run (each member their own token, taken back when they leave the project), through the run's own bridge (a socket the program swaps for a host one is refused),
and its clock stands still while it waits for requests."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import pytest
from conftest import COMPONENTS, add_member, make_app, new_project, wait_finished
from fastapi.testclient import TestClient
from sqlalchemy import select
from starlette.websockets import WebSocketDisconnect

from ide_server.models import User
from sandbox.preview import preview_path

# A stdlib web app on $PORT: GET answers with the path it got and the prefix it is served under; an
# Upgrade: websocket request gets a handshake and its first (short, masked) frame echoed back in capitals.
SERVER = r'''
import base64, hashlib, os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            key = base64.b64encode(hashlib.sha1((self.headers["Sec-WebSocket-Key"] + GUID).encode()).digest()).decode()
            self.send_response(101)
            self.send_header("Upgrade", "websocket"); self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", key); self.end_headers(); self.wfile.flush()
            head = self.rfile.read(2); mask = self.rfile.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(head[1] & 127))).upper()
            self.wfile.write(bytes([0x81, len(data)]) + data); self.wfile.flush()
            self.rfile.read(1)
            return
        body = f"path={self.path} prefix={self.headers.get('X-Forwarded-Prefix')}".encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        print("request", self.path, flush=True)
print("serving on", os.environ["PORT"], flush=True)
ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
'''


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[TestClient]:
    """The runs' app with the deploy component, which serves the Webview's proxy."""
    application = make_app(tmp_path_factory.mktemp("data"), components=[
        *COMPONENTS, "deploy_service.api.secrets:component", "deploy_service.api.deployments:component"])
    with TestClient(application) as client:
        yield client
    application.state.engine.dispose()


def serving(client, run_id: str, timeout: float = 30) -> dict:
    """The run once its program listens on a port."""
    deadline = time.monotonic() + timeout
    while (run := client.get(f"/api/runs/{run_id}").json())["preview_url"] is None:
        assert run["status"] != "finished" and time.monotonic() < deadline, run
        time.sleep(0.1)
    return run


def test_a_web_app_is_served_in_the_webview_to_members_only(owner, person, served):
    pid = new_project(owner, {"main.py": SERVER})
    run = owner.post(f"/api/projects/{pid}/runs", json={"interactive": True, "limits": {"wall_seconds": 2}}).json()
    viewer, stranger = person(), person()
    add_member(owner, pid, viewer, "viewer")
    url = serving(viewer, run["id"])["preview_url"]
    assert url != serving(owner, run["id"])["preview_url"]  # each member's own
    assert url.startswith("/preview/") and run["argv"] == ["python3", "./main.py"]  # the bridge in front is not shown
    time.sleep(2.5)  # past the wall limit: waiting for requests does not count
    answer = served.get(url + "hello?x=1")  # no cookie or token needed: the secret path is the key
    assert (answer.status_code, answer.text) == (200, f"path=/hello?x=1 prefix={url.rstrip('/')}")
    assert answer.headers["content-security-policy"].startswith("sandbox ")  # an opaque origin, as deployed apps
    assert answer.headers["referrer-policy"] == "no-referrer"
    with served.websocket_connect(url + "echo") as ws:
        ws.send_text("ping")
        assert ws.receive_text() == "PING"
    assert stranger.get(f"/api/runs/{run['id']}").status_code == 404  # who is not a member never learns the path
    assert served.get(url[:-1], follow_redirects=False).headers["location"] == url
    assert owner.post(f"/api/runs/{run['id']}/cancel").status_code == 200
    done = wait_finished(owner, run["id"])
    assert done["verdict"] == "cancelled" and done["wall_seconds"] > 2 and "request /hello?x=1" in done["stdout"]
    gone = served.get(url + "hello")
    assert gone.status_code == 404 and "No program is serving here" in gone.text


def test_a_program_listening_on_no_port_answers_503(owner, served):
    pid = new_project(owner, {"main.py": "input()\n"})
    run = owner.post(f"/api/projects/{pid}/runs", json={"interactive": True}).json()
    runs = served.app.state.services.runs
    deadline = time.monotonic() + 30
    while not (live := [p for r, p in runs._previews.values() if r.id == run["id"]]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert owner.get(f"/api/runs/{run['id']}").json()["preview_url"] is None
    with served.app.state.sessionmaker() as db:
        owner_id = str(db.scalar(select(User.id).where(User.username == owner.username)))
    answer = served.get(preview_path(live[0].token_for(owner_id)))
    assert answer.status_code == 503 and "listens on no port" in answer.text
    owner.post(f"/api/runs/{run['id']}/cancel")


def test_a_socket_swapped_for_a_host_one_is_refused(owner, served, tmp_path):
    """The program owns its bridge's folder: it can put a symlink to any host socket where the bridge's was."""
    host_socket = tmp_path / "host.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(host_socket))
    listener.listen(1)
    os.chmod(tmp_path, 0o755)
    swap = ("import os, time\nbridge = '/run/codeyard-preview/app.sock'\n"
            "while not os.path.exists(bridge): time.sleep(0.01)\n"
            f"os.remove(bridge)\nos.symlink({str(host_socket)!r}, bridge)\n")
    pid = new_project(owner, {"main.py": swap + SERVER})
    run = owner.post(f"/api/projects/{pid}/runs", json={"interactive": True}).json()
    url = serving(owner, run["id"])["preview_url"]
    assert served.get(url).status_code == 502
    connection = listener.accept()[0]  # it was reached...
    connection.settimeout(5)
    assert connection.recv(1024) == b""  # ...and left before one byte of the request was sent
    connection.close()
    owner.post(f"/api/runs/{run['id']}/cancel")
    listener.close()


def test_a_member_who_leaves_loses_the_webview_at_once(owner, person, served):
    pid = new_project(owner, {"main.py": SERVER})
    run = owner.post(f"/api/projects/{pid}/runs", json={"interactive": True}).json()
    leaving, staying = person(), person()
    add_member(owner, pid, leaving, "editor")
    add_member(owner, pid, staying, "viewer")
    theirs, kept = serving(leaving, run["id"])["preview_url"], serving(staying, run["id"])["preview_url"]
    assert served.get(theirs + "a").status_code == 200
    with served.websocket_connect(theirs + "echo") as ws:
        ws.send_text("ping")
        assert ws.receive_text() == "PING"
        assert owner.delete(f"/api/projects/{pid}/members/{leaving.username}").status_code == 204
        assert served.get(theirs + "a").status_code == 404  # the very next request
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()  # the open WebSocket ends too
        assert closed.value.code == 4403
    assert served.get(theirs + "b").status_code == 404
    assert served.get(kept + "c").text == f"path=/c prefix={kept.rstrip('/')}"  # the others keep theirs
    assert owner.get(f"/api/runs/{run['id']}").json()["preview_url"] is not None
    owner.post(f"/api/runs/{run['id']}/cancel")
