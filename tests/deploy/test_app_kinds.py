"""Each app kind, detected and deployed for real on bubblewrap, answers through the proxy: at /apps/
on the IDE's port (the ASGI gateway) and on the apps' own port (the edge), alike."""

from __future__ import annotations

import socket

import pytest
from websockets.sync.client import connect

from deploy.conftest import deploy, new_project

STATIC = {"index.html": "<h1>Hello from a static site</h1>\n", "about/index.html": "<p>about us</p>\n",
          ".env": "API_KEY=not-for-the-web\n", "notes/todo.txt": "private-ish\n"}


def test_a_static_site_answers_through_the_proxy(owner, edge):
    project_id = new_project(owner, STATIC)
    deployment = deploy(owner, project_id)
    assert deployment["status"] == "running", deployment["releases"][0]["message"]
    assert deployment["current_release"]["kind"] == "static"
    url = deployment["url"]
    assert url.startswith("/apps/")
    for door in (owner.client, edge):
        page = door.get(url)
        assert page.status_code == 200 and "Hello from a static site" in page.text
        assert door.get(f"{url}about/").text == "<p>about us</p>\n"
        moved = door.get(url.rstrip("/") + "?q=1", follow_redirects=False)
        assert moved.status_code == 308 and moved.headers["location"] == f"{url}?q=1"
        assert door.get(f"{url}.env").status_code == 404  # dotfiles are never served
        assert door.get(f"{url}notes/").status_code == 404  # nor folder listings
        assert door.get(f"{url}notes/todo.txt").text == "private-ish\n"


FLASK_APP = '''
from flask import Flask, Response, request

app = Flask(__name__)


@app.get("/")
def home():
    return "Hello from Flask"


@app.post("/echo")
def echo():
    return {"got": request.get_data(as_text=True), "prefix": request.headers.get("X-Forwarded-Prefix"),
            "cookie": request.headers.get("Cookie", "")}


@app.get("/stream")
def stream():
    return Response((f"line {i}\\n" for i in range(100)), mimetype="text/plain")
'''


def test_a_flask_app_answers_with_streamed_bodies_both_ways(owner, edge):
    project_id = new_project(owner, {"app.py": FLASK_APP})
    deployment = deploy(owner, project_id)
    assert deployment["status"] == "running", deployment["releases"][0]["message"]
    assert deployment["current_release"]["kind"] == "flask"
    for door in (owner.client, edge):
        check_flask_app(door, deployment["url"])


def check_flask_app(client, url: str) -> None:
    assert client.get(url).text == "Hello from Flask"
    body = "x" * 300_000
    client.cookies.set("codeyard_session", "the-ide-session")
    client.cookies.set("theme", "dark")
    try:
        answer = client.post(f"{url}echo", content=body.encode()).json()
    finally:
        client.cookies.clear()
    assert answer["got"] == body and answer["prefix"] == url.rstrip("/")
    assert answer["cookie"] == "theme=dark"  # the IDE's own cookies never reach an app
    chunked = client.post(f"{url}echo", content=iter([b"first,", b"second"]))  # no length: sent chunked
    assert chunked.json()["got"] == "first,second"
    head = client.head(url)
    assert head.status_code == 200 and head.headers["content-length"] == str(len("Hello from Flask")) and not head.content
    with client.stream("GET", f"{url}stream") as response:
        lines = [line for line in response.iter_lines() if line]
        assert response.headers["content-security-policy"].startswith("sandbox")
    assert lines == [f"line {i}" for i in range(100)]


FASTAPI_APP = '''
from fastapi import FastAPI, WebSocket

api = FastAPI()


@api.get("/")
def home():
    return {"hello": "fastapi"}


@api.websocket("/ws")
async def shout(websocket: WebSocket):
    await websocket.accept()
    while True:
        text = await websocket.receive_text()
        await websocket.send_text(text.upper())
'''


def test_a_fastapi_app_answers_http_and_websockets(owner, edge):
    project_id = new_project(owner, {"main.py": FASTAPI_APP})
    deployment = deploy(owner, project_id)
    assert deployment["status"] == "running", deployment["releases"][0]["message"]
    assert deployment["current_release"]["kind"] == "fastapi"
    url = deployment["url"]
    assert owner.client.get(url).json() == {"hello": "fastapi"} == edge.get(url).json()
    with owner.client.websocket_connect(f"{url}ws") as websocket:
        for word in ("hello", "deploys"):
            websocket.send_text(word)
            assert websocket.receive_text() == word.upper()
    with connect(f"ws://{edge.base_url.netloc.decode()}{url}ws", open_timeout=30) as websocket:
        for word in ("through", "the edge", "x" * 200_000):
            websocket.send(word)
            assert websocket.recv(timeout=30) == word.upper()


NODE_SERVER = '''
const http = require("http");
const ms = require("ms");
http.createServer((req, res) => {
  res.setHeader("Content-Type", "text/plain");
  res.end(`Hello from Node at ${req.url} after ${ms(60000)}`);
}).listen(Number(process.env.PORT), "127.0.0.1");
'''


NODE_PACKAGE = '{"name": "hello", "version": "1.0.0", "scripts": {"start": "node server.js"}, "dependencies": {"ms": "2.1.3"}}'


def test_a_node_app_with_an_npm_dependency_answers_through_the_proxy(owner, edge):
    project_id = new_project(owner, {"package.json": NODE_PACKAGE, "server.js": NODE_SERVER})
    deployment = deploy(owner, project_id)
    assert deployment["status"] == "running", deployment["releases"][0]["message"]
    assert deployment["current_release"]["kind"] == "node"
    for door in (owner.client, edge):
        assert door.get(f"{deployment['url']}path?q=1").text == "Hello from Node at /path?q=1 after 1m"


def test_a_project_with_nothing_to_deploy_fails_with_the_reason(owner):
    project_id = new_project(owner, {"notes.txt": "just notes"})
    deployment = deploy(owner, project_id)
    assert deployment["status"] == "failed"
    assert "nothing to deploy found" in deployment["releases"][0]["message"]
    assert owner.client.get(deployment["url"]).status_code == 404


SWAPPING_APP = '''
import http.server, os, sys, time
socket_name = "/run/codeyard-app/app.sock"
for _ in range(100):  # the bridge binds its socket first, then starts us
    if os.path.exists(socket_name):
        break
    time.sleep(0.02)
try:
    os.remove(socket_name)
    os.symlink(sys.argv[1], socket_name)
except OSError as exc:
    print("could not swap the socket:", exc, flush=True)
http.server.HTTPServer(("127.0.0.1", 8080), http.server.SimpleHTTPRequestHandler).serve_forever()
'''


def test_an_app_cannot_point_its_socket_at_a_host_socket(owner, tmp_path):
    """The server connects to an app by the name of its bridge's socket: an app that swaps that name
    for a link to a host socket (the Docker daemon's, say) must never get a visitor's request sent there."""
    host_dir = tmp_path / "host"
    host_dir.mkdir(mode=0o700)
    host_socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    host_socket.bind(str(host_dir / "daemon.sock"))
    host_socket.listen(8)
    host_socket.settimeout(0.5)
    toml = f'[deploy]\nrun = ["python3", "swap.py", "{host_dir / "daemon.sock"}"]\n'
    project_id = new_project(owner, {"swap.py": SWAPPING_APP, "codeyard.toml": toml})
    deployment = deploy(owner, project_id)
    if deployment["status"] == "running":  # the folder was sealed before the app tried: it serves itself
        assert "swap.py" in owner.get(deployment["url"]).text
    else:  # it swapped first: the link is found and refused
        assert "replaced its socket" in deployment["releases"][0]["message"]
    with pytest.raises(TimeoutError):
        host_socket.accept()
    host_socket.close()
