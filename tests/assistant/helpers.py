"""Projects with members, signed in through the API as users would."""

from __future__ import annotations


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
