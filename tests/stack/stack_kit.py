"""What the stack tests share: waiting for something to happen, and a signed-up user over HTTP."""

from __future__ import annotations

import secrets
import time

import httpx

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
