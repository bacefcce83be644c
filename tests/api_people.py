"""Signed-in users for tests that drive the real app through one served TestClient (whose event
loop runs the app's lifespan): each person sends its own Bearer token, since the shared client
keeps no cookies."""

from __future__ import annotations

import secrets
from typing import TypeVar

from fastapi.testclient import TestClient


class Person:
    """A user calling through the shared client; token None is an anonymous visitor."""

    def __init__(self, client: TestClient, token: str | None, username: str = "") -> None:
        self.client, self.token, self.username = client, token, username

    def _headers(self, kwargs: dict) -> dict:
        return {**kwargs.pop("headers", {}), **({"Authorization": f"Bearer {self.token}"} if self.token else {})}

    def request(self, method: str, url: str, **kwargs):
        return self.client.request(method, url, headers=self._headers(kwargs), **kwargs)

    def get(self, url: str, **kwargs):
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs):
        return self.request("POST", url, **kwargs)

    def put(self, url: str, **kwargs):
        return self.request("PUT", url, **kwargs)

    def delete(self, url: str, **kwargs):
        return self.request("DELETE", url, **kwargs)

    def websocket_connect(self, url: str, **kwargs):
        return self.client.websocket_connect(url, headers=self._headers(kwargs), **kwargs)


P = TypeVar("P", bound=Person)


def sign_up(client: TestClient, cls: type[P] = Person) -> P:
    """A new user with a personal token (the registration's cookies are cleared from the shared client)."""
    username = f"u{secrets.token_hex(4)}"
    csrf = client.post("/api/auth/register", json={"username": username, "password": "pass-word-1"}).json()["csrf_token"]
    token = client.post("/api/tokens", json={"name": "t"}, headers={"X-CSRF-Token": csrf}).json()["token"]
    client.cookies.clear()
    return cls(client, token, username)
