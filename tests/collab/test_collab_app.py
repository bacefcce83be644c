"""Collaboration wired into the real app: the files API, membership changes, history restores and a
restart reach stock Yjs clients (Node, y-websocket) that are editing at the same time."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from collab_testkit import CollabServer, JsClients, cookie_header, signed_in, wait_for_file
from waiting import wait_until


@pytest.fixture
def app_js(app_server: CollabServer, node_modules: None):
    clients = JsClients(app_server.ws_url)
    yield clients
    clients.close()


def new_project(owner: httpx.Client, path: str, text: str) -> str:
    pid = owner.post("/api/projects", json={"name": "live"}).json()["id"]
    response = owner.put(f"/api/projects/{pid}/files/content/{path}", content=text.encode())
    assert response.status_code == 200, response.text
    return pid


def open_editor(js: JsClients, name: str, client: httpx.Client, pid: str, path: str) -> dict:
    return js.call("open", name=name, project=pid, file=path, headers=cookie_header(client), user=name)


def on_disk(tmp_path: Path, pid: str, path: str) -> Path:
    return tmp_path / "data" / "projects" / pid / path


def test_a_file_written_through_the_api_merges_with_live_typing(
    app_server: CollabServer, app_js: JsClients, tmp_path: Path
) -> None:
    owner = signed_in(app_server)
    pid = new_project(owner, "main.py", "print('hi')\n")
    assert open_editor(app_js, "alice", owner, pid, "main.py")["text"] == "print('hi')\n"

    current = owner.get(f"/api/projects/{pid}/files/content/main.py").text
    assert owner.put(f"/api/projects/{pid}/files/content/main.py", content=f"{current}# from the API 😀\n").status_code == 200
    typed = ""
    for word in ("# typed ", "while ", "it ", "arrived\n"):  # alice has not seen the API's line yet
        app_js.call("insert", name="alice", index=len(typed), text=word)
        typed += word
    expected = "# typed while it arrived\nprint('hi')\n# from the API 😀\n"
    app_js.call("wait_text", name="alice", text=expected)
    open_editor(app_js, "late", owner, pid, "main.py")
    app_js.call("wait_text", name="late", text=expected)
    wait_for_file(on_disk(tmp_path, pid, "main.py"), expected, 3)

    # A delete closes the room (4404); the file and its document are gone.
    assert owner.delete(f"/api/projects/{pid}/files/content/main.py").status_code == 204
    wait_until(lambda: 4404 in app_js.call("status", name="alice")["closeCodes"])
    assert not on_disk(tmp_path, pid, "main.py").exists()


def test_a_removed_member_is_disconnected_and_a_downgraded_one_becomes_read_only(
    app_server: CollabServer, app_js: JsClients
) -> None:
    owner, guest, helper = signed_in(app_server), signed_in(app_server), signed_in(app_server)
    pid = new_project(owner, "notes.md", "shared\n")
    for member in (guest, helper):
        token = owner.post(f"/api/projects/{pid}/invites", json={"role": "editor"}).json()["token"]
        assert member.post(f"/api/invites/{token}/accept").status_code == 200
    open_editor(app_js, "owner", owner, pid, "notes.md")
    open_editor(app_js, "guest", guest, pid, "notes.md")
    open_editor(app_js, "helper", helper, pid, "notes.md")

    guest_name = guest.get("/api/me").json()["username"]
    assert owner.delete(f"/api/projects/{pid}/members/{guest_name}").status_code == 204
    assert app_js.call("wait_closed", name="guest")["closeCodes"][0] == 4403

    helper_name = helper.get("/api/me").json()["username"]
    assert owner.patch(f"/api/projects/{pid}/members/{helper_name}", json={"role": "viewer"}).status_code == 200
    assert app_js.call("wait_closed", name="helper")["closeCodes"][0] == 4000  # reconnects with the new role
    wait_until(lambda: app_js.call("status", name="helper")["connected"], 10)
    app_js.call("insert", name="helper", index=0, text="VIEWER ")  # refused now
    app_js.call("insert", name="owner", index=7, text="owner\n")
    app_js.call("wait_text", name="helper", text="VIEWER shared\nowner\n")  # only its own copy has its edit
    open_editor(app_js, "check", owner, pid, "notes.md")
    app_js.call("wait_text", name="check", text="shared\nowner\n")


def test_a_history_restore_arrives_live_in_every_editor(
    app_server: CollabServer, app_js: JsClients, tmp_path: Path
) -> None:
    owner = signed_in(app_server)
    pid = new_project(owner, "story.txt", "once upon a time\n")
    first = owner.post(f"/api/projects/{pid}/history", json={"message": "first draft", "name": "draft-1"})
    assert first.status_code == 201, first.text
    version = first.json()["version"]
    open_editor(app_js, "a", owner, pid, "story.txt")
    open_editor(app_js, "b", owner, pid, "story.txt")
    app_js.call("insert", name="a", index=0, text="REWRITE: ")
    app_js.call("wait_text", name="b", text="REWRITE: once upon a time\n")
    wait_for_file(on_disk(tmp_path, pid, "story.txt"), "REWRITE: once upon a time\n", 3)
    second = owner.post(f"/api/projects/{pid}/history", json={"message": "second"})
    assert second.status_code == 201, second.text
    diff = owner.get(f"/api/projects/{pid}/history/diff", params={"old": version, "new": second.json()["version"]})
    assert "-once upon a time" in diff.json()["diff"] and "+REWRITE: once upon a time" in diff.json()["diff"]
    restored = owner.post(f"/api/projects/{pid}/history/restore", json={"version": "draft-1", "path": "story.txt"})
    assert restored.status_code == 200, restored.text
    app_js.call("wait_text", name="a", text="once upon a time\n")
    app_js.call("wait_text", name="b", text="once upon a time\n")
    wait_for_file(on_disk(tmp_path, pid, "story.txt"), "once upon a time\n", 3)
    listed = owner.get(f"/api/projects/{pid}/history", params={"path": "story.txt"}).json()
    assert [c["message"] for c in listed] == ["second", "first draft"] and listed[1]["names"] == ["draft-1"]
    again = owner.post(f"/api/projects/{pid}/history/{version}/name", json={"name": "draft-1"})
    assert again.status_code == 409 and "already called 'draft-1'" in again.json()["detail"]


def test_clients_converge_without_duplicates_after_an_app_restart(
    app_server: CollabServer, app_js: JsClients, tmp_path: Path
) -> None:
    owner = signed_in(app_server)
    pid = new_project(owner, "todo.md", "- one\n")
    open_editor(app_js, "a", owner, pid, "todo.md")
    open_editor(app_js, "b", owner, pid, "todo.md")
    app_js.call("insert", name="a", index=6, text="- two\n")
    app_js.call("wait_text", name="b", text="- one\n- two\n")

    app_server.stop()
    app_js.call("insert", name="a", index=0, text="- a offline\n")
    app_js.call("insert", name="b", index=12, text="- b offline\n")
    app_server.start()
    lines = ("- a offline\n", "- one\n", "- two\n", "- b offline\n")
    texts = lambda: [app_js.call("text", name=name)["text"] for name in ("a", "b")]  # noqa: E731
    wait_until(lambda: texts()[0] == texts()[1] and all(line in texts()[0] for line in lines), 20)
    text = texts()[0]
    assert sorted(text.splitlines(keepends=True)) == sorted(lines), text  # each line exactly once
    wait_for_file(on_disk(tmp_path, pid, "todo.md"), text, 3)
