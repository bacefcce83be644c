"""Stock Yjs clients (yjs + y-websocket WebsocketProvider in Node) against the harness server."""

from __future__ import annotations

from pathlib import Path

import pytest
from collab_testkit import CollabServer, JsClients, stored_text, token
from waiting import wait_until


@pytest.fixture
def notes(project_root: Path, project_id: str) -> Path:
    path = project_root / project_id / "src" / "notes.txt"
    path.parent.mkdir()
    path.write_text("a😀b\n", encoding="utf-8")
    return path


def open_client(js: JsClients, name: str, project_id: str, role: str = "editor", file: str = "src/notes.txt") -> dict:
    return js.call("open", name=name, project=project_id, file=file, token=token(name, role), user=name)


def test_emoji_positions_and_server_edits_line_up(
    js: JsClients, server: CollabServer, project_id: str, notes: Path, db_url: str
) -> None:
    assert open_client(js, "alice", project_id)["text"] == "a😀b\n"
    open_client(js, "bob", project_id)
    # Yjs counts UTF-16 units: the emoji is 2, so index 3 is between "😀" and "b".
    js.call("insert", name="alice", index=3, text="é中")
    js.call("wait_text", name="bob", text="a😀é中b\n")
    js.call("set_cursor", name="bob", index=5)  # just before "b"
    # A server-side edit (UTF-8 offsets inside pycrdt) lands where the text says.
    server.post(f"/test/set-text/{project_id}/src/notes.txt", {"text": "a😀é中🦊b\nend\n"})
    js.call("wait_text", name="alice", text="a😀é中🦊b\nend\n")
    js.call("wait_text", name="bob", text="a😀é中🦊b\nend\n")
    js.call("wait_users", name="alice", users=["bob"])
    # bob's cursor was before "b"; the server inserted "🦊" (2 UTF-16 units) right there.
    wait_until(lambda: js.call("cursor_of", name="alice", user="bob")["index"] in (5, 7))
    wait_until(lambda: notes.read_text(encoding="utf-8") == "a😀é中🦊b\nend\n", 1.5)
    assert stored_text(db_url, f"{project_id}/src/notes.txt") == "a😀é中🦊b\nend\n"


def test_viewer_cannot_change_the_document(
    js: JsClients, server: CollabServer, project_id: str, notes: Path, db_url: str
) -> None:
    open_client(js, "ed", project_id)
    open_client(js, "vi", project_id, role="viewer")
    js.call("insert", name="vi", index=0, text="VANDAL ")
    js.call("insert", name="ed", index=0, text="edit ")
    js.call("wait_users", name="ed", users=["vi"])  # the viewer's presence is accepted
    js.call("wait_text", name="ed", text="edit a😀b\n")
    # A fresh client sees only the editor's change.
    open_client(js, "late", project_id)
    js.call("wait_text", name="late", text="edit a😀b\n")
    wait_until(lambda: notes.read_text(encoding="utf-8") == "edit a😀b\n", 1.5)
    assert stored_text(db_url, f"{project_id}/src/notes.txt") == "edit a😀b\n"


def test_auth_close_codes_and_revocation(js: JsClients, server: CollabServer, project_id: str, notes: Path) -> None:
    bad = js.call("open", name="anon", project=project_id, file="src/notes.txt", token="wrong", timeout=3000)
    assert not bad["synced"] and bad["closeCodes"][0] == 4401
    js.call("close", name="anon")
    outside = js.call("open", name="evil", project=project_id, file="../x/notes.txt", token=token("evil"), timeout=3000)
    assert not outside["synced"]
    js.call("close", name="evil")

    open_client(js, "mallory", project_id)
    open_client(js, "alice", project_id)
    js.call("wait_users", name="alice", users=["mallory"])
    server.post(f"/test/revoke/{project_id}/mallory")
    assert js.call("wait_closed", name="mallory")["closeCodes"][0] == 4403
    js.call("wait_users", name="alice", users=[])


def test_late_joiner_gets_presence_and_leaver_disappears_at_once(
    js: JsClients, server: CollabServer, project_id: str, notes: Path
) -> None:
    open_client(js, "alice", project_id)
    open_client(js, "bob", project_id)
    open_client(js, "carol", project_id)
    js.call("wait_users", name="carol", users=["alice", "bob"])
    js.call("close", name="bob")
    # y-protocols would time a silent client out after 30 s; the server removes it at once.
    js.call("wait_users", name="carol", users=["alice"], timeout=1000)
    js.call("wait_users", name="alice", users=["carol"], timeout=1000)


def test_outside_change_merges_with_concurrent_client_edits(
    js: JsClients, server: CollabServer, project_id: str, notes: Path, db_url: str
) -> None:
    notes.write_text("one\ntwo\nthree\n", encoding="utf-8")  # before the room opens
    assert open_client(js, "alice", project_id)["text"] == "one\ntwo\nthree\n"
    open_client(js, "bob", project_id)
    # A program rewrites line 2 while alice types on line 4 and bob on line 1.
    js.call("insert", name="alice", index=len("one\ntwo\nthree\n"), text="four 🦊\n")
    notes.write_text("one\nTWO\nthree\n", encoding="utf-8")
    js.call("insert", name="bob", index=0, text="zero ")
    expected = "zero one\nTWO\nthree\nfour 🦊\n"
    js.call("wait_text", name="alice", text=expected)
    js.call("wait_text", name="bob", text=expected)
    wait_until(lambda: notes.read_text(encoding="utf-8") == expected, 2.0)
    assert stored_text(db_url, f"{project_id}/src/notes.txt") == expected
