"""A class's worth of open sockets and slow requests leaves room for the next student (issue 25).

Against a real `codeyard serve` (uvicorn, uvloop, SQLite): requests that are still arriving or
waiting hold no database connection, so a sign-up goes through while many are open; and when the
database really is out of connections the answer is a quick 503 with Retry-After, not a hang.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy
import websockets
from fastapi.testclient import TestClient
from serve_process import codeyard_serve
from sqlalchemy.orm import sessionmaker

from ide_server import db
from ide_server.app import FULL_COLLECTION_EVERY, create_app
from ide_server.settings import Settings

HELD = db.POOL_SIZE + db.POOL_OVERFLOW + 20  # more than the pool has connections


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("capacity")
    with codeyard_serve(data_dir) as url:
        yield url


def sign_up(url: str, name: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=10)
    answer = client.post("/api/auth/register", json={"username": name, "password": "a long password"})
    answer.raise_for_status()
    client.headers["X-CSRF-Token"] = client.cookies["codeyard_csrf"]
    return client


def slow_upload(url: str, cookie: str, csrf: str, path: str) -> socket.socket:
    """A save whose body is still on its way: the route is awaiting it."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(f"PUT {path} HTTP/1.1\r\nHost: {host}:{port}\r\nCookie: {cookie}\r\nX-CSRF-Token: {csrf}\r\n"
                 f"Content-Length: 1000\r\nContent-Type: application/octet-stream\r\n\r\nprint(".encode())
    return sock


async def hold_collab_sockets(url: str, cookie: str, project: str, count: int) -> list:
    ws_url = url.replace("http", "ws", 1) + f"/ws/collab/{project}/main.py"
    return [await websockets.connect(ws_url, additional_headers={"Cookie": cookie}, origin=url) for _ in range(count)]


def test_a_new_student_signs_up_while_many_requests_and_sockets_are_open(server: str) -> None:
    teacher = sign_up(server, "teacher")
    project = teacher.post("/api/projects", json={"name": "class", "template": "python"}).json()["id"]
    cookie = "; ".join(f"{k}={v}" for k, v in teacher.cookies.items())
    uploads = [slow_upload(server, cookie, teacher.headers["X-CSRF-Token"],
                           f"/api/projects/{project}/files/content/slow{i}.py") for i in range(HELD)]

    async def scenario() -> float:
        sockets = await hold_collab_sockets(server, cookie, project, HELD)
        await asyncio.sleep(1.0)  # every upload and socket is past its access check
        started = time.monotonic()
        async with httpx.AsyncClient(base_url=server, timeout=20) as client:
            answer = await client.post("/api/auth/register", json={"username": "newcomer", "password": "a long password"})
            answer.raise_for_status()
            assert (await client.get("/api/me")).json()["username"] == "newcomer"
        took = time.monotonic() - started
        for ws in sockets:
            await ws.close()
        return took

    try:
        took = asyncio.run(scenario())
    finally:
        for sock in uploads:
            sock.close()
    print(f"sign-up with {HELD} slow uploads and {HELD} collab sockets open: {took * 1000:.0f} ms")
    # Before, each held request kept a pooled connection and a sign-up waited for one (30 s).
    assert took < 5.0


def test_no_connection_within_the_wait_is_a_503_with_retry_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(db, "POOL_SIZE", 1)
    monkeypatch.setattr(db, "POOL_OVERFLOW", 0)
    monkeypatch.setattr(db, "POOL_TIMEOUT_S", 0.3)
    app = create_app(Settings(data_dir=tmp_path, sandbox_backend="bwrap"))
    with TestClient(app) as client:
        assert client.post("/api/auth/register", json={"username": "ann", "password": "a long password"}).status_code == 201
        with app.state.engine.connect():  # the only connection is taken
            answer = client.get("/api/me")
        assert answer.status_code == 503
        assert answer.headers["Retry-After"] == "2"
        assert "busy" in answer.json()["detail"]
        assert client.get("/api/me").json()["username"] == "ann"


def test_a_database_out_of_reach_is_a_503_with_retry_after_not_a_500(tmp_path: Path) -> None:
    """PostgreSQL restarting refuses connections ("the database system is starting up") for a
    while: the stack test's sign-ups got 500s with a traceback then."""
    app = create_app(Settings(data_dir=tmp_path, sandbox_backend="bwrap"))
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nowhere = f"postgresql+psycopg://codeyard@127.0.0.1:{closed.getsockname()[1]}/codeyard"
    with TestClient(app, raise_server_exceptions=False) as client:
        working = app.state.sessionmaker
        app.state.sessionmaker = sessionmaker(sqlalchemy.create_engine(nowhere))
        answer = client.post("/api/auth/register", json={"username": "ann", "password": "a long password"})
        assert answer.status_code == 503, answer.text
        assert answer.headers["Retry-After"] == "2"
        app.state.sessionmaker = working
        assert client.post("/api/auth/register", json={"username": "ann", "password": "a long password"}).status_code == 201


def test_a_project_request_checks_who_asks_in_one_connection_and_two_queries(tmp_path: Path) -> None:
    """The session's user and the caller's role on the project are two prepared queries on one
    pooled connection, however many access dependencies the route has (each extra hop or
    checkout cost a class's requests their turn on the event loop)."""
    app = create_app(Settings(data_dir=tmp_path, sandbox_backend="bwrap"))
    with TestClient(app) as client:
        client.post("/api/auth/register", json={"username": "ann", "password": "a long password"}).raise_for_status()
        client.headers["X-CSRF-Token"] = client.cookies["codeyard_csrf"]
        project = client.post("/api/projects", json={"name": "p", "template": "python"}).json()["id"]
        statements: list[str] = []
        checkouts: list[object] = []
        engine = app.state.engine
        sqlalchemy.event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
        sqlalchemy.event.listen(engine.pool, "checkout", lambda *args: checkouts.append(args[0]))
        answer = client.get(f"/api/projects/{project}/files/content/main.py")
        assert answer.status_code == 200
        assert [s.split()[0] for s in statements] == ["SELECT", "SELECT"], statements
        assert len(checkouts) == 1


def test_a_started_server_keeps_what_it_holds_out_of_full_collections(tmp_path: Path) -> None:
    """Full collections walked the whole started server, ~0.4 s each, seven a minute per worker under
    100 students: it freezes its objects once started and collects fully less often, until shutdown."""
    gc_before = gc.get_threshold()
    application = create_app(Settings(data_dir=tmp_path, sandbox_backend="bwrap"))
    with TestClient(application):
        assert gc.get_freeze_count() > 10_000  # the modules, the app, its services
        assert gc.get_threshold()[2] == FULL_COLLECTION_EVERY > gc_before[2]
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == gc_before
    application.state.engine.dispose()
