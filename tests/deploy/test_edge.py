"""The apps' own port (deploy_service.edge) at the HTTP level: what a browser, curl or a script may
send it, answered like the IDE port's gateway would, and every request's in-flight count back to 0."""

from __future__ import annotations

import socket
import time

from waiting import wait_until

from deploy.conftest import deploy, new_project
from deploy_service import edge as edge_module

APP = '''
import time
from flask import Flask, Response, request

app = Flask(__name__)


@app.get("/")
def home():
    return "edge " + request.headers.get("X-Forwarded-Prefix", "-")


@app.get("/drip")
def drip():
    def lines():
        for i in range(50):
            time.sleep(0.05)
            yield f"drop {i}\\n"
    return Response(lines(), mimetype="text/plain")


@app.post("/count")
def count():
    return str(len(request.get_data()))
'''


def raw(port: int, data: bytes, until_closed: bool = True, timeout: float = 30) -> bytes:
    """Send bytes as they are and read what comes back (until the server closes, or for a moment)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        if not until_closed:
            sock.settimeout(2)
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (TimeoutError, ConnectionResetError):  # (a reset: the server closed with our bytes unread)
            pass
    return received


def test_the_apps_port_speaks_plain_http_as_clients_send_it(owner, served, edge):
    project_id = new_project(owner, {"app.py": APP})
    deployment = deploy(owner, project_id)
    assert deployment["status"] == "running", deployment["releases"][0]["message"]
    url, slug, port = deployment["url"], deployment["slug"], edge.base_url.port

    # Two requests written at once (pipelined) get their answers in order on one connection.
    pipelined = (f"GET {url} HTTP/1.1\r\nHost: x\r\n\r\n"
                 f"POST {url}count HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello").encode()
    answers = raw(port, pipelined)
    assert answers.count(b"HTTP/1.1 200") == 2
    assert answers.index(f"edge /apps/{slug}".encode()) < answers.rindex(b"\r\n\r\n5")

    # An HTTP/1.0 client gets a streamed answer ended by the connection closing, not chunk-encoded.
    old = raw(port, f"GET {url}drip HTTP/1.0\r\nHost: x\r\n\r\n".encode())
    head, _, body = old.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding" not in head.lower()
    assert body == b"".join(f"drop {i}\n".encode() for i in range(50))

    # Expect: 100-continue (curl sends it for large bodies) gets its go-ahead, then the answer.
    continued = raw(port, f"POST {url}count HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n"
                          f"Connection: close\r\n\r\nabc".encode())
    assert continued.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200") and continued.endswith(b"\r\n\r\n3")

    # Garbage is a 400 with a reason, and the server keeps serving.
    bad = raw(port, b"NOT HTTP AT ALL\r\n\r\n")
    assert bad.startswith(b"HTTP/1.1 400") and b"Malformed HTTP request." in bad
    assert edge.get(url).text == f"edge /apps/{slug}"

    # Paths that are no app's, unknown apps and a CONNECT get clear answers.
    assert edge.get("/dashboard").status_code == 404
    assert edge.get("/apps/no-such-app/").text == "No app is deployed here."
    assert raw(port, b"CONNECT example.org:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\n").startswith(b"HTTP/1.1 405")


def test_a_visitor_leaving_mid_answer_frees_the_request(owner, served, edge):
    project_id = new_project(owner, {"app.py": APP})
    deployment = deploy(owner, project_id)
    url = deployment["url"]
    [instance] = served.app.state.services.deploys.routes.get(deployment["slug"]).instances
    with socket.create_connection(("127.0.0.1", edge.base_url.port), timeout=10) as sock:
        sock.sendall(f"GET {url}drip HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        assert instance.in_flight == 1  # counted while it streams, so a switch would wait for it
    wait_until(lambda: instance.in_flight == 0, timeout=10)
    assert edge.get(url).status_code == 200  # the app serves the next visitor
    wait_until(lambda: instance.in_flight == 0, timeout=10)  # (the count drops just after the last byte went out)


def test_apps_on_their_own_host_name_at_the_apps_port(owner, served, edge):
    project_id = new_project(owner, {"app.py": APP})
    slug = deploy(owner, project_id)["slug"]
    deploys = served.app.state.services.deploys
    deploys.apps_host = f"codeyard.test:{edge.base_url.port}"
    try:
        page = edge.get("/", headers={"Host": f"{slug}.apps.codeyard.test:{edge.base_url.port}"})
        assert page.text == "edge -"  # served at the root: no prefix
        assert "content-security-policy" not in page.headers  # an origin of its own: no sandbox needed
        assert edge.get("/", headers={"Host": f"other.apps.codeyard.test:{edge.base_url.port}"}).status_code == 404
    finally:
        deploys.apps_host = None


def test_a_stopped_app_answers_503_then_404_once_deleted(owner, edge):
    project_id = new_project(owner, {"app.py": APP})
    url = deploy(owner, project_id)["url"]
    assert owner.post(f"/api/projects/{project_id}/deployment/stop").status_code == 200
    stopped = edge.get(url)
    assert stopped.status_code == 503 and stopped.headers["retry-after"] == "2"
    assert owner.delete(f"/api/projects/{project_id}/deployment").status_code == 204
    time.sleep(0.1)
    assert edge.get(url).status_code == 404


def test_slow_or_huge_request_heads_are_cut_off(owner, edge, monkeypatch):
    monkeypatch.setattr(edge_module, "HEAD_READ_TIMEOUT", 0.5)
    port = edge.base_url.port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /apps/x/ HTTP/1.1\r\nHost: x\r\n")  # ... and the rest never comes
        began = time.monotonic()
        assert sock.recv(100) == b""  # closed by the server
        assert time.monotonic() - began < 5
    huge = raw(port, b"GET /apps/x/ HTTP/1.1\r\nHost: x\r\n" + b"X-Filler: " + b"a" * 100_000 + b"\r\n\r\n")
    assert huge.startswith(b"HTTP/1.1 431")
    assert edge.get("/apps/no-such-app/").status_code == 404  # and it serves on
