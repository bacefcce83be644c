"""Project secrets over the API (SQLite and PostgreSQL): who may see and write them, name and size
rules, sealed at rest, and values that never come back in an answer or a log record."""

import logging
import secrets
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import select

from deploy_service import secrets as secrets_module
from deploy_service.secret_box import SecretBox, SecretUnreadable
from deploy_service.secret_models import ProjectSecret
from ide_server.errors import Conflict


def project_of(owner) -> str:
    answer = owner.post("/api/projects", json={"name": f"s{secrets.token_hex(3)}"})
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def add_member(owner, project_id: str, member, role: str) -> None:
    link = owner.post(f"/api/projects/{project_id}/invites", json={"role": role}).json()
    assert member.post(f"/api/invites/{link['token']}/accept").status_code == 200


def secret_value() -> str:
    return f"sv-{secrets.token_hex(12)}"


def test_box_opens_only_what_it_sealed_for_that_project_and_name():
    box = SecretBox("server key one")
    sealed = box.seal("hunter2 and more", "proj1", "API_KEY")
    assert b"hunter2" not in sealed
    assert box.open(sealed, "proj1", "API_KEY") == "hunter2 and more"
    assert box.seal("hunter2 and more", "proj1", "API_KEY") != sealed  # a fresh nonce each time
    for project_id, name, opener in [("proj2", "API_KEY", box), ("proj1", "OTHER", box),
                                     ("proj1", "API_KEY", SecretBox("server key two"))]:
        with pytest.raises(SecretUnreadable):
            opener.open(sealed, project_id, name)
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(SecretUnreadable):
        box.open(tampered, "proj1", "API_KEY")


def test_editors_write_and_list_names_but_never_read_values(new_user):
    owner, editor = new_user(), new_user()
    pid = project_of(owner)
    add_member(owner, pid, editor, "editor")
    value = secret_value()
    created = editor.put(f"/api/projects/{pid}/secrets/API_KEY", json={"value": value})
    assert created.status_code == 201, created.text
    assert created.json()["name"] == "API_KEY" and created.json()["is_set"] is True
    assert created.json()["updated_by"] == editor.username
    replaced = owner.put(f"/api/projects/{pid}/secrets/API_KEY", json={"value": value + "2"})
    assert replaced.status_code == 200 and replaced.json()["updated_by"] == owner.username
    listing = editor.get(f"/api/projects/{pid}/secrets")
    assert listing.status_code == 200
    assert listing.json()["expose_to_runs"] is False
    assert [(s["name"], s["is_set"]) for s in listing.json()["secrets"]] == [("API_KEY", True)]
    for answer in (created, replaced, listing):
        assert value not in answer.text
    assert editor.delete(f"/api/projects/{pid}/secrets/API_KEY").status_code == 204
    assert editor.get(f"/api/projects/{pid}/secrets").json()["secrets"] == []
    gone = editor.delete(f"/api/projects/{pid}/secrets/API_KEY")
    assert gone.status_code == 404 and "no secret named 'API_KEY'" in gone.json()["detail"]


def test_viewers_strangers_and_anonymous_see_not_even_names(new_user, anon):
    owner, viewer, stranger = new_user(), new_user(), new_user()
    pid = project_of(owner)
    owner.patch(f"/api/projects/{pid}", json={"visibility": "public"})
    add_member(owner, pid, viewer, "viewer")
    assert owner.put(f"/api/projects/{pid}/secrets/HIDDEN_NAME", json={"value": "x"}).status_code == 201
    expected = {viewer: 403, stranger: 403, anon: 401}  # public project: strangers can see it, not its secrets
    for client, code in expected.items():
        for method, url, body in [("GET", "", None), ("PUT", "/HIDDEN_NAME", {"value": "y"}),
                                  ("DELETE", "/HIDDEN_NAME", None), ("PATCH", "", {"expose_to_runs": True})]:
            answer = client.request(method, f"/api/projects/{pid}/secrets{url}", json=body)
            assert answer.status_code == code, (method, url, answer.text)
            if method == "GET":
                assert "HIDDEN_NAME" not in answer.text
    owner.patch(f"/api/projects/{pid}", json={"visibility": "private"})
    assert stranger.get(f"/api/projects/{pid}/secrets").status_code == 404
    assert owner.get(f"/api/projects/{pid}/secrets").json()["secrets"][0]["name"] == "HIDDEN_NAME"


def test_only_owners_expose_secrets_to_runs(new_user):
    owner, editor = new_user(), new_user()
    pid = project_of(owner)
    add_member(owner, pid, editor, "editor")
    denied = editor.patch(f"/api/projects/{pid}/secrets", json={"expose_to_runs": True})
    assert denied.status_code == 403 and "owner" in denied.json()["detail"]
    allowed = owner.patch(f"/api/projects/{pid}/secrets", json={"expose_to_runs": True})
    assert allowed.status_code == 200 and allowed.json()["expose_to_runs"] is True
    assert editor.get(f"/api/projects/{pid}/secrets").json()["expose_to_runs"] is True
    assert owner.patch(f"/api/projects/{pid}/secrets", json={"expose_to_runs": False}).json()["expose_to_runs"] is False


@pytest.mark.parametrize("name", ["1ABC", "A-B", "PATH", "port", "Home", "LD_PRELOAD", "CODEYARD_TOKEN",
                                  "PYTHONPATH", "X" * 65, "caf\u00e9"])
def test_bad_names_are_400s_naming_the_field(new_user, name):
    owner = new_user()
    pid = project_of(owner)
    answer = owner.put(f"/api/projects/{pid}/secrets/{name}", json={"value": "v"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["detail"].startswith("name: ")
    assert owner.get(f"/api/projects/{pid}/secrets").json()["secrets"] == []


def test_bad_values_and_too_many_secrets(new_user, monkeypatch):
    owner = new_user()
    pid = project_of(owner)
    nul = owner.put(f"/api/projects/{pid}/secrets/A", json={"value": "a\0b"})
    assert nul.status_code == 400 and nul.json()["detail"] == "value: must not contain NUL characters"
    wide = owner.put(f"/api/projects/{pid}/secrets/A", json={"value": "\u00e9" * (secrets_module.MAX_VALUE_BYTES // 2 + 1)})
    assert wide.status_code == 400 and "at most 32768 bytes" in wide.json()["detail"]
    long = owner.put(f"/api/projects/{pid}/secrets/A", json={"value": "x" * (secrets_module.MAX_VALUE_BYTES + 1)})
    assert long.status_code == 422 and "body.value" in long.json()["detail"]
    value = secret_value()
    wrong_type = owner.put(f"/api/projects/{pid}/secrets/A", json={"value": [value]})
    assert wrong_type.status_code == 422 and value not in wrong_type.text
    monkeypatch.setattr(secrets_module, "MAX_SECRETS_PER_PROJECT", 2)
    for name in ("A", "B"):
        assert owner.put(f"/api/projects/{pid}/secrets/{name}", json={"value": "v"}).status_code == 201
    full = owner.put(f"/api/projects/{pid}/secrets/C", json={"value": "v"})
    assert full.status_code == 409 and "at most 2 secrets" in full.json()["detail"]
    assert owner.put(f"/api/projects/{pid}/secrets/A", json={"value": "replacing is fine"}).status_code == 200


def test_concurrent_writes_of_one_new_name_all_succeed(new_user):
    owner = new_user()
    pid = project_of(owner)
    editors = [new_user() for _ in range(4)]
    for editor in editors:
        add_member(owner, pid, editor, "editor")
    with ThreadPoolExecutor(len(editors)) as pool:
        answers = list(pool.map(lambda e: e.put(f"/api/projects/{pid}/secrets/SHARED", json={"value": e.username}), editors))
    assert sorted(a.status_code for a in answers) == [200, 200, 200, 201], [a.text for a in answers]
    assert [s["name"] for s in owner.get(f"/api/projects/{pid}/secrets").json()["secrets"]] == ["SHARED"]


def test_sealed_at_rest_and_given_only_to_that_projects_deploys(new_user, app):
    owner = new_user()
    pid, other = project_of(owner), project_of(owner)
    value = secret_value()
    owner.put(f"/api/projects/{pid}/secrets/DATABASE_URL", json={"value": value})
    owner.put(f"/api/projects/{other}/secrets/OTHER", json={"value": "other"})
    store = app.state.services.secrets
    with app.state.sessionmaker() as db:
        row = db.get(ProjectSecret, (pid, "DATABASE_URL"))
        assert value.encode() not in row.sealed
        assert store.environment_for(db, pid) == {"DATABASE_URL": value}
        assert store.run_environment_for(db, pid) == {}  # runs get nothing until the owner allows it
        assert store.environment_for(db, other) == {"OTHER": "other"}
    owner.patch(f"/api/projects/{pid}/secrets", json={"expose_to_runs": True})
    with app.state.sessionmaker() as db:
        assert store.run_environment_for(db, pid) == {"DATABASE_URL": value}
        # A row moved to another project in the database does not open there.
        row = db.get(ProjectSecret, (other, "OTHER"))
        row.sealed = db.get(ProjectSecret, (pid, "DATABASE_URL")).sealed
        db.commit()
        with pytest.raises(Conflict, match="secret OTHER cannot be decrypted.*set it again"):
            store.environment_for(db, other)


def test_forks_start_without_the_secrets(new_user, app):
    owner, stranger = new_user(), new_user()
    pid = project_of(owner)
    owner.put(f"/api/projects/{pid}/secrets/TOKEN", json={"value": "t"})
    owner.patch(f"/api/projects/{pid}", json={"visibility": "public"})
    for who in (owner, stranger):
        fork = who.post(f"/api/projects/{pid}/fork", json={})
        assert fork.status_code == 201, fork.text
        assert who.get(f"/api/projects/{fork.json()['id']}/secrets").json()["secrets"] == []
        with app.state.sessionmaker() as db:
            assert app.state.services.secrets.environment_for(db, fork.json()["id"]) == {}


def test_deleting_the_project_deletes_its_secrets(new_user, app):
    owner = new_user()
    pid = project_of(owner)
    owner.put(f"/api/projects/{pid}/secrets/TOKEN", json={"value": "t"})
    assert owner.delete(f"/api/projects/{pid}").status_code == 204
    with app.state.sessionmaker() as db:
        assert db.scalars(select(ProjectSecret).where(ProjectSecret.project_id == pid)).all() == []


def test_values_never_reach_a_log_record(new_user, caplog):
    owner = new_user()
    pid = project_of(owner)
    value = secret_value()
    caplog.set_level(logging.DEBUG)
    answers = [
        owner.put(f"/api/projects/{pid}/secrets/API_KEY", json={"value": value}),
        owner.put(f"/api/projects/{pid}/secrets/API_KEY", json={"value": value}),
        owner.put(f"/api/projects/{pid}/secrets/PATH", json={"value": value}),
        owner.put(f"/api/projects/{pid}/secrets/API_KEY", json={"value": value + "\0"}),
        owner.put(f"/api/projects/{pid}/secrets/API_KEY", json={"value": {"nested": value}}),
        owner.get(f"/api/projects/{pid}/secrets"),
        owner.delete(f"/api/projects/{pid}/secrets/API_KEY"),
    ]
    assert [a.status_code for a in answers] == [201, 200, 400, 400, 422, 200, 204]
    assert any("API_KEY" in r.getMessage() for r in caplog.records)  # the writes were logged, by name
    for record in caplog.records:
        assert value not in record.getMessage() and value not in repr(record.__dict__)
    for answer in answers:
        assert value not in answer.text
