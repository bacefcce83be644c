"""What the stack tests share: waiting for something to happen, a signed-up user over HTTP, and an editor on a
file over the collab socket, both through the proxy and, when asked, pinned to one app replica by its cookie
(docker/proxy-entrypoint.sh), checked against the replica the proxy says answered."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Mapping

import httpx

from collab.client import CollabClient

PROXY = "http://127.0.0.1:8780"
# The app replicas in the proxy's APP_UPSTREAMS order: the cookie PIN=<n> pins a client to the n-th (the others serve
# it while that one is down)
REPLICAS = ("127.0.0.1:8781", "127.0.0.1:8782")
PIN = "codeyard_replica"


def served_by(headers: Mapping[str, str]) -> int | None:
    """The replica that answered through the proxy, by its number (1, 2): its X-Codeyard-Replica, which names the
    replica, never its address; None when it names none."""
    replica = headers.get("x-codeyard-replica")
    return int(replica) if replica else None


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


def stack_answering(timeout: float) -> None:
    """Each replica ready, asked directly (asked through the proxy while they start, it marks them failed for 10 s and
    answers 502), then the proxy passing a client pinned to each replica to that one."""
    for replica in REPLICAS:
        eventually(lambda: httpx.get(f"http://{replica}/readyz", timeout=5).status_code == 200, timeout, f"{replica} answering")
    for n in range(1, len(REPLICAS) + 1):
        eventually(lambda: served_by(httpx.get(f"{PROXY}/readyz", headers={"Cookie": f"{PIN}={n}"}, timeout=5).headers)
                   == n, 60, f"the proxy passing a client pinned to replica {n} there")


class User:
    """A signed-up user with a personal token, talking through the proxy; pinned to one replica when `replica` is
    given (1 or 2), and then every answer must come from that replica."""

    def __init__(self, token: str | None = None, replica: int | None = None) -> None:
        if token is None:
            with httpx.Client(base_url=PROXY, timeout=30) as client:
                name = f"u{secrets.token_hex(4)}"
                csrf = client.post("/api/auth/register", json={"username": name, "password": "pass-word-1"}).json()["csrf_token"]
                token = client.post("/api/tokens", json={"name": "t"}, headers={"X-CSRF-Token": csrf}).json()["token"]
        self.token = token
        self.replica = replica
        self.http = httpx.Client(base_url=PROXY, timeout=60, headers={"Authorization": f"Bearer {token}"},
                                 cookies={PIN: str(replica)} if replica else None, event_hooks={"response": [self._landed]})

    def _landed(self, response: httpx.Response) -> None:
        """A pinned user's every answer comes from its replica."""
        assert self.replica is None or served_by(response.headers) == self.replica, (
            f"{response.request.url.path} was answered by replica {served_by(response.headers)}, not {self.replica}")

    def on(self, replica: int) -> User:
        """The same user pinned to replica `replica` (1 or 2) through the proxy."""
        return User(self.token, replica)

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
    """A user's editor open on one file through the proxy, as the IDE's Yjs one: every (re)connection syncs both
    ways, so edits a server took down with it unstored are sent again, and what the editor already has is not
    duplicated. Pinned to one replica by its cookie when `replica` is given, as a browser keeps its cookie."""

    def __init__(self, user: User, project: str, path: str, replica: int | None = None) -> None:
        super().__init__()
        self.headers = {"Authorization": f"Bearer {user.token}"}
        if replica:
            self.headers["Cookie"] = f"{PIN}={replica}"
        self.url = PROXY.replace("http", "ws", 1) + f"/ws/collab/{project}/{path}"

    async def open(self) -> str:
        """Connect through the proxy; the replica it landed on (1 or 2), as the proxy's handshake answer names it."""
        await self.connect(self.url, self.headers)
        assert self.socket is not None and self.socket.response is not None
        return served_by(self.socket.response.headers)

    async def shows(self, text: str, timeout: float = 30) -> None:
        """Wait until the document reads `text` (the room's updates are applied as they come)."""
        assert await self.wait_for(lambda now: now == text, timeout), f"the editor shows {str(self.text)!r}, not {text!r}"

    async def dropped(self, timeout: float = 30) -> None:
        """Wait until the server end of the socket has gone."""
        assert self.following is not None
        await asyncio.wait_for(asyncio.shield(self.following), timeout)
