"""Projects with members, signed in through the API as users would."""

from __future__ import annotations

import json
import secrets
import time

from fastapi.testclient import TestClient

from tests.conftest import PASSWORD


def project_with_members(new_user) -> tuple[str, dict]:
    """A project id, and clients of its owner, an editor, a viewer and a stranger."""
    owner, editor, viewer, stranger = new_user(), new_user(), new_user(), new_user()
    project_id = owner.post("/api/projects", json={"name": "assistant", "template": "python"}).json()["id"]
    for client, role in ((editor, "editor"), (viewer, "viewer")):
        token = owner.post(f"/api/projects/{project_id}/invites", json={"role": role}).json()["token"]
        assert client.post(f"/api/invites/{token}/accept").status_code == 200
    return project_id, {"owner": owner, "editor": editor, "viewer": viewer, "stranger": stranger}


def bodies(path: str = "main.py") -> dict[str, dict]:
    """A valid body for each generating route."""
    content = 'def add(a, b):\n    return a + b\n\nprint(add(1, "2"))\n'
    output = ('Traceback (most recent call last):\n  File "main.py", line 4, in <module>\n'
              '    print(add(1, "2"))\n  File "main.py", line 2, in add\n    return a + b\n'
              "TypeError: unsupported operand type(s) for +: 'int' and 'str'\n")
    return {
        "complete": {"path": path, "prefix": "def add(a, b):\n    return a", "suffix": "\n",
                     "open_files": [{"path": "utils.py", "content": "PI = 3.14\n"}]},
        "explain": {"path": path, "content": content, "output": output},
        "chat": {"path": path, "content": content, "messages": [{"role": "user", "content": "What does add do?"}]},
    }


def signed_in(app) -> TestClient:
    client = TestClient(app)
    csrf = client.post("/api/auth/register", json={"username": f"as{secrets.token_hex(4)}",
                                                   "password": PASSWORD}).json()["csrf_token"]
    client.headers["X-CSRF-Token"] = csrf
    return client


def new_project(client: TestClient) -> str:
    return client.post("/api/projects", json={"name": "ai", "template": "python"}).json()["id"]


def stream_text(client: TestClient, url: str, body: dict) -> tuple[str, list[dict]]:
    """The streamed answer's text and its chunks (checking the stream's framing on the way)."""
    chunks, finished = [], False
    with client.stream("POST", url, json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith("data: ") and not finished
            if line == "data: [DONE]":
                finished = True
            else:
                chunks.append(json.loads(line[len("data: "):]))
    assert finished
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks), chunks


def wait_idle(service, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while (stats := service.engine.stats()).num_running or stats.num_waiting:
        assert time.monotonic() < deadline, "the request is still running"
        time.sleep(0.05)
    assert stats.num_free_blocks == stats.num_total_blocks
