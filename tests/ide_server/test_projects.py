"""Projects: templates, listing, rename, visibility, fork, delete, members and invites."""

import os
from pathlib import Path

import pytest

TEMPLATE_FILES = {
    "python": {"main.py", "README.md"},
    "node": {"index.js", "package.json", "README.md"},
    "static": {"index.html", "style.css", "script.js"},
    "flask": {"app.py", "templates/index.html", "requirements.txt", "README.md"},
    "fastapi": {"main.py", "requirements.txt", "README.md"},
}


def project_dir(settings, project_id: str) -> Path:
    return settings.projects_dir / project_id


def files_of(client, project_id: str) -> set[str]:
    return {e["path"] for e in client.get(f"/api/projects/{project_id}/files").json() if e["kind"] == "file"}


@pytest.mark.parametrize("template", sorted(TEMPLATE_FILES))
def test_create_from_each_template(new_user, template):
    alice = new_user()
    assert template in [t["id"] for t in alice.get("/api/templates").json()]
    response = alice.post("/api/projects", json={"name": f"My {template} app", "template": template})
    assert response.status_code == 201
    project = response.json()
    assert project["role"] == "owner" and project["visibility"] == "private"
    assert files_of(alice, project["id"]) == TEMPLATE_FILES[template]


def test_flask_template_is_a_flask_app(new_user):
    alice = new_user()
    pid = alice.post("/api/projects", json={"name": "web", "template": "flask"}).json()["id"]
    source = alice.get(f"/api/projects/{pid}/files/content/app.py").text
    assert "from flask import Flask" in source
    compile(source, "app.py", "exec")


def test_unknown_template_and_bad_names_are_refused(new_user):
    alice = new_user()
    response = alice.post("/api/projects", json={"name": "x", "template": "cobol"})
    assert response.status_code == 400
    assert "unknown template 'cobol'" in response.json()["detail"]
    assert alice.post("/api/projects", json={"name": "   "}).status_code == 400
    assert alice.post("/api/projects", json={"name": "a\x00b"}).status_code == 422
    assert alice.post("/api/projects", json={"name": "x" * 101}).status_code == 422


def test_ids_are_random_and_list_shows_own_and_shared(new_user):
    alice, bob = new_user(), new_user()
    ids = [alice.post("/api/projects", json={"name": f"p{i}"}).json()["id"] for i in range(3)]
    assert len(set(ids)) == 3 and all(len(i) >= 12 for i in ids)
    assert not any(i.isdigit() for i in ids)
    shared = bob.post("/api/projects", json={"name": "bob's"}).json()["id"]
    invite = bob.post(f"/api/projects/{shared}/invites", json={"role": "editor"}).json()
    assert alice.post(f"/api/invites/{invite['token']}/accept").status_code == 200

    listed = {p["id"]: p["role"] for p in alice.get("/api/projects").json()}
    assert listed == {**{i: "owner" for i in ids}, shared: "editor"}
    assert [p["id"] for p in bob.get("/api/projects").json()] == [shared]


def test_rename_visibility_and_public_read(new_user, anon):
    alice, bob = new_user(), new_user()
    pid = alice.post("/api/projects", json={"name": "secret"}).json()["id"]
    assert anon.get(f"/api/projects/{pid}").status_code == 401
    assert bob.get(f"/api/projects/{pid}").status_code == 404

    response = alice.patch(f"/api/projects/{pid}", json={"name": "open", "visibility": "public"})
    assert response.status_code == 200 and response.json()["name"] == "open"
    assert anon.get(f"/api/projects/{pid}").json()["role"] is None
    assert "main.py" in files_of(anon, pid)
    assert anon.get(f"/api/projects/{pid}/files/content/main.py").status_code == 200
    # Public means readable, not writable, and the member list stays private.
    assert bob.put(f"/api/projects/{pid}/files/content/main.py", content=b"x").status_code == 403
    assert anon.put(f"/api/projects/{pid}/files/content/main.py", content=b"x").status_code == 401
    assert bob.patch(f"/api/projects/{pid}", json={"name": "mine"}).status_code == 403
    assert bob.get(f"/api/projects/{pid}/members").status_code == 403
    assert alice.patch(f"/api/projects/{pid}", json={"visibility": "nope"}).status_code == 422


def test_fork_copies_files_but_not_symlinks(new_user, anon, settings):
    alice, bob = new_user(), new_user()
    pid = alice.post("/api/projects", json={"name": "orig", "template": "static"}).json()["id"]
    alice.put(f"/api/projects/{pid}/files/content/data/blob.bin", content=bytes(range(256)))
    os.symlink("/etc", project_dir(settings, pid) / "etc-link")

    assert bob.post(f"/api/projects/{pid}/fork", json={}).status_code == 404  # private: no access
    alice.patch(f"/api/projects/{pid}", json={"visibility": "public"})
    assert anon.post(f"/api/projects/{pid}/fork", json={}).status_code == 401
    response = bob.post(f"/api/projects/{pid}/fork", json={})
    assert response.status_code == 201
    fork = response.json()
    assert fork["name"] == "orig (fork)" and fork["forked_from"] == pid
    assert fork["role"] == "owner" and fork["visibility"] == "private"
    assert bob.get(f"/api/projects/{fork['id']}/files/content/data/blob.bin").content == bytes(range(256))
    assert files_of(bob, fork["id"]) == {"index.html", "style.css", "script.js", "data/blob.bin"}
    assert not (project_dir(settings, fork["id"]) / "etc-link").exists()
    # The fork is independent of the original.
    bob.put(f"/api/projects/{fork['id']}/files/content/index.html", content=b"changed")
    assert alice.get(f"/api/projects/{pid}/files/content/index.html").content != b"changed"


def test_delete_removes_project_and_files(new_user, settings):
    alice, bob = new_user(), new_user()
    pid = alice.post("/api/projects", json={"name": "gone"}).json()["id"]
    invite = alice.post(f"/api/projects/{pid}/invites", json={"role": "editor"}).json()
    bob.post(f"/api/invites/{invite['token']}/accept")
    assert bob.delete(f"/api/projects/{pid}").status_code == 403  # editors can't delete
    assert project_dir(settings, pid).is_dir()
    assert alice.delete(f"/api/projects/{pid}").status_code == 204
    assert not project_dir(settings, pid).exists()
    assert alice.get(f"/api/projects/{pid}").status_code == 404
    assert bob.get("/api/projects").json() == []


def test_roles_and_the_last_owner(new_user):
    alice, bob, carol = new_user(), new_user(), new_user()
    pid = alice.post("/api/projects", json={"name": "team"}).json()["id"]
    for user, role in ((bob, "viewer"), (carol, "editor")):
        token = alice.post(f"/api/projects/{pid}/invites", json={"role": role}).json()["token"]
        assert user.get(f"/api/invites/{token}").json() == {"project_name": "team", "role": role}
        assert user.post(f"/api/invites/{token}/accept").json()["project"]["role"] == role

    members = {m["username"]: m["role"] for m in bob.get(f"/api/projects/{pid}/members").json()}
    assert members == {alice.username: "owner", bob.username: "viewer", carol.username: "editor"}

    # viewer: read only; editor: writes files but can't manage members.
    assert bob.put(f"/api/projects/{pid}/files/content/a.txt", content=b"a").status_code == 403
    assert carol.put(f"/api/projects/{pid}/files/content/a.txt", content=b"a").status_code == 200
    assert carol.patch(f"/api/projects/{pid}/members/{bob.username}", json={"role": "owner"}).status_code == 403

    # The last owner can't leave or step down ...
    assert alice.delete(f"/api/projects/{pid}/members/{alice.username}").status_code == 409
    response = alice.patch(f"/api/projects/{pid}/members/{alice.username}", json={"role": "editor"})
    assert response.status_code == 409 and "at least one owner" in response.json()["detail"]
    # ... until there is another owner.
    assert alice.patch(f"/api/projects/{pid}/members/{carol.username}", json={"role": "owner"}).json()["role"] == "owner"
    assert alice.patch(f"/api/projects/{pid}/members/{alice.username}", json={"role": "viewer"}).status_code == 200
    assert carol.delete(f"/api/projects/{pid}/members/{bob.username}").status_code == 204
    assert bob.get(f"/api/projects/{pid}").status_code == 404
    assert carol.delete(f"/api/projects/{pid}/members/nobody-at-all").status_code == 404


def test_invites_can_be_listed_and_revoked(new_user):
    alice, bob, carol = new_user(), new_user(), new_user()
    pid = alice.post("/api/projects", json={"name": "inv"}).json()["id"]
    created = alice.post(f"/api/projects/{pid}/invites", json={"role": "editor"})
    assert created.status_code == 201
    invite = created.json()
    assert invite["url"] == f"/invite/{invite['token']}"
    listed = alice.get(f"/api/projects/{pid}/invites").json()
    assert [(i["id"], i["role"]) for i in listed] == [(invite["id"], "editor")]
    assert "token" not in listed[0]

    assert alice.delete(f"/api/projects/{pid}/invites/{invite['id']}").status_code == 204
    response = bob.post(f"/api/invites/{invite['token']}/accept")
    assert response.status_code == 404 and "revoked" in response.json()["detail"]
    assert bob.get(f"/api/projects/{pid}").status_code == 404

    # Accepting never lowers a role, and links can be used by several people.
    viewer_link = alice.post(f"/api/projects/{pid}/invites", json={"role": "viewer"}).json()["token"]
    assert alice.post(f"/api/invites/{viewer_link}/accept").json()["project"]["role"] == "owner"
    assert carol.post(f"/api/invites/{viewer_link}/accept").json()["project"]["role"] == "viewer"
    assert bob.post(f"/api/invites/{viewer_link}/accept").json()["project"]["role"] == "viewer"
