"""What the stack tests share: waiting for something to happen, a signed-up user over HTTP, and an editor on a
file over the collab socket."""

from __future__ import annotations

import asyncio
import secrets
import time

import httpx

from collab.client import CollabClient

PROXY = "http://127.0.0.1:8780"
REPLICAS = ("http://127.0.0.1:8781", "http://127.0.0.1:8782")


def eventually(check, timeout: float, what: str):
    """check() until it returns something truthy without raising; its last error when time is up."""
    deadline, error = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            if result := check():
                return result
        except (httpx.HTTPError, AssertionError, OSError, KeyError, ValueError) as exc:  # answers of a service coming back
            error = exc
        time.sleep(1)
    raise AssertionError(f"{what} did not happen within {timeout:g} s (last error: {error!r})")


class User:
    """A signed-up user with a personal token, talking to one base URL (the proxy or one replica)."""

    def __init__(self, base: str = PROXY, token: str | None = None) -> None:
        self.base = base
        if token is None:
            with httpx.Client(base_url=base, timeout=30) as client:
                name = f"u{secrets.token_hex(4)}"
                csrf = client.post("/api/auth/register", json={"username": name, "password": "pass-word-1"}).json()["csrf_token"]
                token = client.post("/api/tokens", json={"name": "t"}, headers={"X-CSRF-Token": csrf}).json()["token"]
        self.token = token
        self.http = httpx.Client(base_url=base, timeout=60, headers={"Authorization": f"Bearer {token}"})

    def on(self, base: str) -> User:
        return User(base, self.token)

    def project(self, files: dict[str, str]) -> str:
        pid = self.http.post("/api/projects", json={"name": f"p{secrets.token_hex(3)}"}).json()["id"]
        for path, text in files.items():
            assert self.http.put(f"/api/projects/{pid}/files/content/{path}", content=text.encode()).status_code in (200, 201)
        return pid

    def run(self, pid: str, **body) -> str:
        started = self.http.post(f"/api/projects/{pid}/runs", json=body)
        assert started.status_code == 202, started.text
        return started.json()["id"]

    def finished(self, run_id: str, timeout: float = 120) -> dict:
        return eventually(lambda: (r := self.http.get(f"/api/runs/{run_id}").json())["status"] == "finished" and r,
                          timeout, f"run {run_id} finishing")


class Editor(CollabClient):
    """A user's editor open on one file, as the IDE's Yjs one: every (re)connection syncs both ways, so edits a
    server took down with it unstored are sent again, and what the editor already has is not duplicated."""

    def __init__(self, user: User, project: str, path: str) -> None:
        super().__init__()
        self.headers = {"Authorization": f"Bearer {user.token}"}
        self.where = f"/ws/collab/{project}/{path}"

    async def open_on(self, base: str) -> None:
        await self.connect(base.replace("http", "ws", 1) + self.where, self.headers)

    async def shows(self, text: str, timeout: float = 30) -> None:
        """Wait until the document reads `text` (the room's updates are applied as they come)."""
        assert await self.wait_for(lambda now: now == text, timeout), f"the editor shows {str(self.text)!r}, not {text!r}"

    async def dropped(self, timeout: float = 30) -> None:
        """Wait until the server end of the socket has gone."""
        assert self.following is not None
        await asyncio.wait_for(asyncio.shield(self.following), timeout)
