"""`llm serve`'s access line is written once a response ends, not as its headers go out (access_log.py)."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from llm_engine.entrypoints.access_log import LateAccessLog


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def access_lines() -> Iterator[Records]:
    logger = logging.getLogger("uvicorn.access")
    records = Records()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(records)
    try:
        yield records
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)


gate = threading.Event()


async def app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/fails":
        raise RuntimeError("before any response")
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": b"data: first\n\n", "more_body": True})
    while not gate.is_set():
        await asyncio.sleep(0.005)
    await send({"type": "http.response.body", "body": b"data: last\n\n", "more_body": False})


@pytest.fixture
def server(access_lines) -> Iterator[int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, http=LateAccessLog, log_config=None, lifespan="off")
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not running.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield port
    finally:
        running.should_exit = True
        thread.join(10)


def read_until(conn: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = conn.recv(4096)
        assert chunk, f"connection closed before {marker!r}: {data!r}"
        data += chunk
    return data


def test_a_streams_access_line_is_written_after_its_last_event_with_uvicorns_text(server, access_lines):
    gate.clear()
    with socket.create_connection(("127.0.0.1", server)) as conn:
        conn.sendall(b"GET /stream?x=1 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert b"data: first" in read_until(conn, b"data: first")
        time.sleep(0.05)  # the server has had time to write a line, had it one to write
        assert access_lines.lines == []  # uvicorn's own protocol wrote it with the headers
        port = conn.getsockname()[1]
        gate.set()
        read_until(conn, b"0\r\n\r\n")
    deadline = time.monotonic() + 5
    while not access_lines.lines and time.monotonic() < deadline:
        time.sleep(0.01)
    assert access_lines.lines == [f'127.0.0.1:{port} - "GET /stream?x=1 HTTP/1.1" 200']


def test_a_response_uvicorn_answers_itself_is_logged_as_uvicorn_logs_it(server, access_lines):
    with socket.create_connection(("127.0.0.1", server)) as conn:
        conn.sendall(b"GET /fails HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_until(conn, b"\r\n\r\n").startswith(b"HTTP/1.1 500")
        port = conn.getsockname()[1]
    deadline = time.monotonic() + 5
    while not access_lines.lines and time.monotonic() < deadline:
        time.sleep(0.01)
    assert access_lines.lines == [f'127.0.0.1:{port} - "GET /fails HTTP/1.1" 500']


def test_llm_serve_runs_uvicorn_with_the_late_access_line(monkeypatch):
    from typer.testing import CliRunner

    from llm_engine import cli

    seen: dict[str, object] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: seen.update(options))
    monkeypatch.setattr("llm_engine.entrypoints.app.create_app", lambda *args, **kwargs: object())
    result = CliRunner().invoke(cli.app, ["serve", "--port", "1"])
    assert result.exit_code == 0, result.output
    assert seen["http"] is LateAccessLog
