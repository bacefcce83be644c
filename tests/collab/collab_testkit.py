"""Helpers for the collab tests: a uvicorn server in a subprocess and real Yjs clients in Node."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from pycrdt import Doc, Text
from sqlalchemy import create_engine

from collab.connection import CollabConnection
from collab.protocol import (
    AwarenessEntry,
    AwarenessUpdate,
    SyncStep1,
    SyncStep2,
    SyncUpdate,
    decode_message,
    encode_awareness,
    encode_sync_step1,
    encode_sync_step2,
    encode_sync_update,
)
from collab.room import RoomKey
from collab.rooms import RoomManager
from collab.store import UpdateStore

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
JS_DIR = HERE / "js"
SECRET = "test-secret"
PASSWORD = "correct horse battery"


def token(user: str, role: str = "editor") -> str:
    return f"{SECRET}:{user}:{role}"


def signed_in(server: CollabServer) -> httpx.Client:
    """A newly registered user of the real app (collab_app_factory), signed in with a session cookie."""
    client = httpx.Client(base_url=server.url)
    response = client.post("/api/auth/register", json={"username": f"u{secrets.token_hex(4)}", "password": PASSWORD})
    assert response.status_code == 201, response.text
    client.headers["X-CSRF-Token"] = response.json()["csrf_token"]
    return client


def cookie_header(client: httpx.Client) -> dict[str, str]:
    return {"Cookie": "; ".join(f"{name}={value}" for name, value in client.cookies.items())}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ensure_node_modules() -> None:
    """Install the pinned Yjs clients once (npm ci from package-lock.json)."""
    marker = JS_DIR / "node_modules" / ".package-lock.json"
    lock = JS_DIR / "package-lock.json"
    if marker.exists() and marker.stat().st_mtime >= lock.stat().st_mtime:
        return
    subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
        cwd=JS_DIR, check=True, capture_output=True, timeout=300,
    )


def stored_text(db_url: str, room: str) -> str:
    """The document text as rebuilt from the database alone."""
    engine = create_engine(db_url)
    try:
        doc = Doc()
        text = doc.get("content", type=Text)
        for update in UpdateStore(engine).load(room):
            doc.apply_update(update)
        return str(text)
    finally:
        engine.dispose()


class CollabServer:
    """The test harness app under uvicorn, in its own process so it can be killed and restarted."""

    def __init__(self, db_url: str, root: Path, log_path: Path, *, redis_url: str | None = None,
                 port: int | None = None, extra_env: dict[str, str] | None = None,
                 app: str = "collab_harness:create_app") -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.env = {
            **os.environ,
            "COLLAB_DB_URL": db_url,
            "COLLAB_ROOT": str(root),
            "COLLAB_SECRET": SECRET,
            "PYTHONPATH": str(REPO),
            **(extra_env or {}),
        }
        if redis_url:
            self.env["COLLAB_REDIS_URL"] = redis_url
        self.app = app
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", str(HERE), self.app,
             "--factory", "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning",
             # CRDT updates are tiny and binary: compressing each frame costs more than it saves.
             "--ws-per-message-deflate", "false"],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
        )
        deadline = time.monotonic() + 60  # a loaded machine can take a while to import the app
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-2000:]}")
            try:
                httpx.get(f"{self.url}/", timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("server did not start")

    def kill(self) -> None:
        """Crash the server (SIGKILL): nothing gets a chance to flush."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def post(self, path: str, body: dict | None = None) -> dict:
        response = httpx.post(f"{self.url}{path}", json=body or {}, timeout=10)
        response.raise_for_status()
        return response.json()


class JsClients:
    """A Node process holding named y-websocket clients, driven by JSON lines."""

    def __init__(self, ws_url: str) -> None:
        self.process = subprocess.Popen(
            ["node", str(JS_DIR / "driver.js"), ws_url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=JS_DIR,
        )

    def call(self, op: str, **args) -> dict:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"node driver died: {self.process.stderr.read() if self.process.stderr else ''}")
        reply = json.loads(line)
        if not reply.pop("ok"):
            raise AssertionError(reply["error"])
        return reply

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


MARKER_LINE = r"\n⟦[^⟧]*⟧"


def run_fuzz(urls: list[str], project_id: str, file: str, *, clients: int, seconds: float,
             meanwhile=None) -> dict:
    """Run js/fuzz.js (random marker inserts/deletes, reconnects); `meanwhile()` runs during it."""
    config = {
        "urls": urls, "project": project_id, "file": file, "clients": clients, "seconds": seconds,
        "tokens": [token(f"user{i}") for i in range(clients)],
    }
    fuzz = subprocess.Popen(
        ["node", str(JS_DIR / "fuzz.js"), json.dumps(config)],
        cwd=JS_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        if meanwhile:
            meanwhile()
        out, err = fuzz.communicate(timeout=120)
    finally:
        if fuzz.poll() is None:
            fuzz.kill()
    assert fuzz.returncode == 0, err
    return json.loads(out)


def assert_nothing_duplicated_or_lost(result: dict, seed: str) -> str:
    """Every marker inserted and not deleted appears exactly once; nothing else besides the seed."""
    assert result["converged"], result["texts"]
    text = result["texts"][0]
    inserted, deleted = result["inserted"], set(result["deleted"])
    assert deleted and len(set(inserted)) == len(inserted)
    for marker in inserted:
        expected = 0 if marker in deleted else 1
        assert text.count(marker) == expected, f"{marker} appears {text.count(marker)} times, expected {expected}"
    assert re.sub(MARKER_LINE, "", text) == seed
    return text


def wait_for_file(path: Path, text: str, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while path.read_text(encoding="utf-8") != text and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.read_text(encoding="utf-8") == text


class PyClient:
    """A y-websocket client built on pycrdt, connected through asyncio queues."""

    def __init__(self, manager: RoomManager, key: RoomKey, user: str, *, can_write: bool = True) -> None:
        self.doc = Doc()
        self.text = self.doc.get("content", type=Text)
        self.user = user
        self.client_id = abs(hash(user)) % 2**31
        self.awareness: dict[int, str] = {}
        self.closed_with: int | None = None
        self._inbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._local_updates: list[bytes] = []
        self.doc.observe(self._on_local)
        self.connection = CollabConnection(
            manager, key, send=self._deliver, receive=self._inbox.get, close=self._closed,
            can_write=can_write, user_id=user,
        )
        self._applying = False

    def _on_local(self, event) -> None:
        if not self._applying:
            self._inbox.put_nowait(encode_sync_update(event.update))

    async def _deliver(self, data: bytes) -> None:
        message = decode_message(data)
        self._applying = True
        try:
            if isinstance(message, SyncStep1):
                self._inbox.put_nowait(encode_sync_step2(self.doc.get_update(message.state_vector)))
            elif isinstance(message, (SyncStep2, SyncUpdate)):
                self.doc.apply_update(message.update)
            elif isinstance(message, AwarenessUpdate):
                for entry in message.entries:
                    if entry.state_json == "null":
                        self.awareness.pop(entry.client_id, None)
                    else:
                        self.awareness[entry.client_id] = entry.state_json
        finally:
            self._applying = False

    async def _closed(self, code: int, reason: str) -> None:
        self.closed_with = code
        self._inbox.put_nowait(None)

    async def start(self) -> None:
        self.task = asyncio.create_task(self.connection.serve())
        self._inbox.put_nowait(encode_sync_step1(self.doc.get_state()))
        self.set_presence({"user": {"name": self.user}}, clock=1)

    async def reconnect(self) -> PyClient:
        """A new connection holding this client's document, as a y-websocket provider reconnects:
        the server's sync step 1 is answered with every update the server lacks."""
        again = PyClient(self.connection.manager, self.connection.key, self.user)
        again._applying = True
        again.doc.apply_update(self.doc.get_update())
        again._applying = False
        await again.start()
        return again

    def set_presence(self, state: dict, clock: int) -> None:
        self._inbox.put_nowait(encode_awareness([AwarenessEntry(self.client_id, clock, json.dumps(state))]))

    def type(self, index_utf8: int, piece: str) -> None:
        self.text.insert(index_utf8, piece)

    async def leave(self) -> None:
        self._inbox.put_nowait(None)
        await self.task
