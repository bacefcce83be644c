"""Accounts: registration, sessions, CSRF, API tokens, login throttling."""

from argon2 import PasswordHasher
from fastapi.testclient import TestClient

from ide_server import security


def test_register_login_me_logout(app, anon, new_user):
    alice = new_user()
    assert alice.get("/api/me").json()["username"] == alice.username

    fresh = TestClient(app)
    response = fresh.post("/api/auth/login", json={"username": alice.username.upper(), "password": alice.password})
    assert response.status_code == 200
    cookie = response.headers.get_list("set-cookie")
    session_cookie = next(c for c in cookie if c.startswith("codeyard_session="))
    assert "HttpOnly" in session_cookie and "SameSite=lax" in session_cookie
    csrf_cookie = next(c for c in cookie if c.startswith("codeyard_csrf="))
    assert "HttpOnly" not in csrf_cookie
    assert fresh.get("/api/me").json()["username"] == alice.username

    csrf = response.json()["csrf_token"]
    assert fresh.post("/api/auth/logout", headers={"X-CSRF-Token": csrf}).status_code == 204
    assert fresh.get("/api/me").status_code == 401
    assert anon.get("/api/me").status_code == 401


def test_logout_ends_the_session_on_the_server(app, new_user):
    alice = new_user()
    stolen = dict(alice.cookies)
    assert alice.post("/api/auth/logout").status_code == 204
    replay = TestClient(app, cookies=stolen)
    assert replay.get("/api/me").status_code == 401


def test_registration_errors_are_clear(anon, new_user):
    taken = new_user()
    response = anon.post("/api/auth/register", json={"username": taken.username, "password": "long enough pw"})
    assert response.status_code == 409
    assert "taken" in response.json()["detail"]

    response = anon.post("/api/auth/register", json={"username": "ok-name", "password": "short"})
    assert response.status_code == 400
    assert "at least 8 characters" in response.json()["detail"]

    response = anon.post("/api/auth/register", json={"username": "bad name!", "password": "long enough pw"})
    assert response.status_code == 422
    assert response.json()["detail"].startswith("body.username:")

    response = anon.post("/api/auth/register", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 422


def test_wrong_password_is_401_without_saying_which_part_was_wrong(anon, new_user):
    alice = new_user()
    wrong_password = anon.post("/api/auth/login", json={"username": alice.username, "password": "nope-nope"})
    no_user = anon.post("/api/auth/login", json={"username": "nobody-here", "password": "nope-nope"})
    assert wrong_password.status_code == no_user.status_code == 401
    assert wrong_password.json() == no_user.json() == {"detail": "wrong username or password"}


def test_cookie_writes_need_the_csrf_header(app, new_user):
    alice = new_user()
    without = TestClient(app, cookies=dict(alice.cookies))
    response = without.post("/api/projects", json={"name": "x"})
    assert response.status_code == 403
    assert "X-CSRF-Token" in response.json()["detail"]

    wrong = without.post("/api/projects", json={"name": "x"}, headers={"X-CSRF-Token": "0" * 64})
    assert wrong.status_code == 403

    # A CSRF token of another session does not work either.
    bob = new_user()
    crossed = without.post("/api/projects", json={"name": "x"}, headers={"X-CSRF-Token": bob.headers["X-CSRF-Token"]})
    assert crossed.status_code == 403

    assert without.get("/api/projects").status_code == 200  # reads need no token
    assert alice.post("/api/projects", json={"name": "x"}).status_code == 201
    assert [p["name"] for p in alice.get("/api/projects").json()] == ["x"]


def test_api_tokens_work_without_csrf_and_stop_working_when_revoked(app, anon, new_user):
    alice = new_user()
    created = alice.post("/api/tokens", json={"name": "laptop"})
    assert created.status_code == 201
    token = created.json()["token"]
    assert token.startswith("cy_")

    listed = alice.get("/api/tokens").json()
    assert [t["name"] for t in listed] == ["laptop"]
    assert "token" not in listed[0]  # shown once only

    bearer = TestClient(app, headers={"Authorization": f"Bearer {token}"})
    assert bearer.get("/api/me").json()["username"] == alice.username
    assert bearer.post("/api/projects", json={"name": "via token"}).status_code == 201  # no CSRF needed
    assert alice.get("/api/tokens").json()[0]["last_used_at"] is not None

    # Another user can't revoke it, and it is not listed for them.
    bob = new_user()
    assert bob.get("/api/tokens").json() == []
    assert bob.delete(f"/api/tokens/{created.json()['id']}").status_code == 404

    assert alice.delete(f"/api/tokens/{created.json()['id']}").status_code == 204
    response = bearer.get("/api/me")
    assert response.status_code == 401
    assert response.json()["detail"] == "invalid or revoked API token"
    assert anon.get("/api/me", headers={"Authorization": "Bearer cy_made_up"}).status_code == 401
    assert anon.get("/api/me", headers={"Authorization": "Basic abc"}).status_code == 401


def test_login_is_throttled_per_user_and_address(app, new_user, settings):
    alice = new_user()
    attacker = TestClient(app, client=("203.0.113.7", 4000))
    for _ in range(settings.login_max_failures):
        assert attacker.post("/api/auth/login", json={"username": alice.username, "password": "guess-guess"}).status_code == 401
    blocked = attacker.post("/api/auth/login", json={"username": alice.username, "password": alice.password})
    assert blocked.status_code == 429
    assert 1 <= int(blocked.headers["Retry-After"]) <= settings.login_window_seconds + 1
    assert "try again" in blocked.json()["detail"]

    # The real user, from another address, still gets in.
    elsewhere = TestClient(app, client=("198.51.100.2", 4000))
    assert elsewhere.post("/api/auth/login", json={"username": alice.username, "password": alice.password}).status_code == 200


def test_production_hashes_are_argon2id_with_owasp_parameters(monkeypatch):
    monkeypatch.setattr(security, "_hasher", PasswordHasher(**security.ARGON2_PARAMETERS))
    hashed = security.hash_password("pass phrase")
    assert hashed.startswith("$argon2id$") and "m=19456,t=2,p=1" in hashed
    assert security.verify_password(hashed, "pass phrase")
    assert not security.verify_password(hashed, "wrong")
    assert not security.verify_password(None, "pass phrase")
    assert not security.verify_password("not-a-hash", "pass phrase")


def test_registration_can_be_closed(app, anon, settings, monkeypatch):
    monkeypatch.setattr(settings, "allow_registration", False)
    response = anon.post("/api/auth/register", json={"username": "latecomer", "password": "long enough pw"})
    assert response.status_code == 403 and "sign-up is closed" in response.json()["detail"]


def test_changing_your_password_keeps_this_browser_and_signs_out_the_others(app, new_user):
    alice = new_user()
    other = TestClient(app)
    assert other.post("/api/auth/login", json={"username": alice.username, "password": alice.password}).status_code == 200
    wrong = alice.post("/api/me/password", json={"current_password": "not it", "new_password": "a new long password"})
    assert wrong.status_code == 400 and wrong.json()["detail"] == "the current password is not right"
    short = alice.post("/api/me/password", json={"current_password": alice.password, "new_password": "x"})
    assert short.status_code == 400 and "at least" in short.json()["detail"]
    changed = alice.post("/api/me/password", json={"current_password": alice.password, "new_password": "a new long password"})
    assert changed.status_code == 200
    alice.headers["X-CSRF-Token"] = changed.json()["csrf_token"]
    assert alice.get("/api/me").json()["username"] == alice.username  # this browser goes on
    assert other.get("/api/me").status_code == 401  # the other one is signed out
    fresh = TestClient(app)
    assert fresh.post("/api/auth/login", json={"username": alice.username, "password": alice.password}).status_code == 401
    assert fresh.post("/api/auth/login", json={"username": alice.username, "password": "a new long password"}).status_code == 200


def test_guessing_the_current_password_is_throttled_like_sign_in(app, new_user, settings):
    """A stolen session must not become a way to guess the password without the sign-in throttle."""
    alice = new_user()
    for _ in range(settings.login_max_failures):
        wrong = alice.post("/api/me/password", json={"current_password": "guess-guess", "new_password": "a new long password"})
        assert wrong.status_code == 400
    blocked = alice.post("/api/me/password", json={"current_password": alice.password, "new_password": "a new long password"})
    assert blocked.status_code == 429 and "Retry-After" in blocked.headers
