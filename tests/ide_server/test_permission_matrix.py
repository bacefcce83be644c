"""Who may call what: every HTTP route and WebSocket of the IDE app × every kind of caller, as one table.

A Datasette-style permission matrix. `MATRIX` below is the policy, written out: one row per route (read
from the app itself, so a route without a row fails `test_the_table_has_a_row_for_every_route`), one
column per caller, and in each cell what that caller gets:

    ok    the access rules let the caller through (the route answered 2xx/3xx, or a 4xx of its own:
          422 for the deliberately invalid body every write is sent, 404 for a thing that is not there...)
    401   not signed in
    403   signed in (or a member) but not allowed
    404   hidden: the project (run, token, classroom...) is not the caller's to see

Callers (the private project unless marked /pub):

    anon       nobody signed in
    other      a signed-in user who is not a member
    admin      the server's admin, not a member (being admin gives no say over others' projects)
    viewer     member with the viewer role
    editor     member with the editor role (session cookie + CSRF header, as the browser does)
    owner      the project's owner
    token      another editor, calling with a personal API token (Bearer; tokens carry no scopes)
    xsite      the owner's session cookie sent by another site: no CSRF header, a foreign Origin
    anon/pub   nobody signed in, on a public project
    other/pub  a non-member, on a public project

Writes are sent `[]` as their JSON body: valid JSON that no body model accepts, so a caller who gets
through sees 422 and nothing is changed, since FastAPI resolves the access dependencies before it
validates the body. The things named in a path are real: lesson projects, a file, a finished run, a
token, an invite and its link, a secret, a checkpoint, a classroom of the owner's with a student; only
the LLM's model names are not (the LLM is switched off here: its 503 comes past the check).
Rows whose allowed call uses up what it names (DELETE, logout, accepting an invite) get fresh things after each "ok".
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from string import Formatter

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select
from starlette.testclient import WebSocketDenialResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from ide_server.access import app_routes
from ide_server.app import create_app
from ide_server.deps import CSRF_COOKIE, CSRF_HEADER, SESSION_COOKIE, CurrentUser
from ide_server.models import Membership, Role, User
from ide_server.services import accounts
from ide_server.settings import Settings

ACTORS = ("anon", "other", "admin", "viewer", "editor", "owner", "token", "xsite", "anon/pub", "other/pub")

MATRIX = """
#      route                                                               anon other admin viewer editor owner token xsite anon/pub other/pub
GET    /api/openapi.json                                                   ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
GET    /api/docs                                                           ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
GET    /healthz                                                            ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
GET    /readyz                                                             ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
POST   /api/auth/register                                                  ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
POST   /api/auth/login                                                     ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
POST   /api/auth/logout                                                    401  ok    ok    ok     ok     ok    ok    403   401      ok
GET    /api/me                                                             401  ok    ok    ok     ok     ok    ok    ok    401      ok
POST   /api/me/password                                                    401  ok    ok    ok     ok     ok    ok    403   401      ok
GET    /api/tokens                                                         401  ok    ok    ok     ok     ok    ok    ok    401      ok
POST   /api/tokens                                                         401  ok    ok    ok     ok     ok    ok    403   401      ok
DELETE /api/tokens/{token_id}                                              401  404   404   404    404    ok    404   403   401      404
GET    /api/templates                                                      ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
GET    /api/projects                                                       401  ok    ok    ok     ok     ok    ok    ok    401      ok
POST   /api/projects                                                       401  ok    ok    ok     ok     ok    ok    403   401      ok
GET    /api/projects/{project_id}                                          401  404   404   ok     ok     ok    ok    ok    ok       ok
PATCH  /api/projects/{project_id}                                          401  404   404   403    403    ok    403   403   401      403
DELETE /api/projects/{project_id}                                          401  404   404   403    403    ok    403   403   401      403
POST   /api/projects/{project_id}/fork                                     401  404   404   ok     ok     ok    ok    403   401      ok
GET    /api/projects/{project_id}/members                                  401  404   404   ok     ok     ok    ok    ok    401      403
PATCH  /api/projects/{project_id}/members/{username}                       401  404   404   403    403    ok    403   403   401      403
DELETE /api/projects/{project_id}/members/{username}                       401  404   404   403    403    ok    403   403   401      403
GET    /api/projects/{project_id}/invites                                  401  404   404   403    403    ok    403   ok    401      403
POST   /api/projects/{project_id}/invites                                  401  404   404   403    403    ok    403   403   401      403
DELETE /api/projects/{project_id}/invites/{invite_id}                      401  404   404   403    403    ok    403   403   401      403
# an invite link is its own secret: whoever holds it may see and accept it
GET    /api/invites/{token}                                                401  ok    ok    ok     ok     ok    ok    ok    401      ok
POST   /api/invites/{token}/accept                                         401  ok    ok    ok     ok     ok    ok    403   401      ok
GET    /api/projects/{project_id}/files                                    401  404   404   ok     ok     ok    ok    ok    ok       ok
POST   /api/projects/{project_id}/files                                    401  404   404   403    ok     ok    ok    403   401      403
GET    /api/projects/{project_id}/files/content/{path:path}                401  404   404   ok     ok     ok    ok    ok    ok       ok
GET    /api/projects/{project_id}/files/search                             401  404   404   ok     ok     ok    ok    ok    ok       ok
PUT    /api/projects/{project_id}/files/content/{path:path}                401  404   404   403    ok     ok    ok    403   401      403
DELETE /api/projects/{project_id}/files/content/{path:path}                401  404   404   403    ok     ok    ok    403   401      403
POST   /api/projects/{project_id}/files/move                               401  404   404   403    ok     ok    ok    403   401      403
GET    /api/projects/{project_id}/files/zip                                401  404   404   ok     ok     ok    ok    ok    ok       ok
POST   /api/projects/{project_id}/files/zip                                401  404   404   403    ok     ok    ok    403   401      403
GET    /v1/models                                                          401  ok    ok    ok     ok     ok    ok    ok    401      ok
POST   /v1/completions                                                     401  ok    ok    ok     ok     ok    ok    403   401      ok
POST   /v1/chat/completions                                                401  ok    ok    ok     ok     ok    ok    403   401      ok
GET    /llm/metrics                                                        401  ok    ok    ok     ok     ok    ok    ok    401      ok
GET    /v2                                                                 401  ok    ok    ok     ok     ok    ok    ok    401      ok
GET    /v2/health/live                                                     401  ok    ok    ok     ok     ok    ok    ok    401      ok
GET    /v2/health/ready                                                    401  ok    ok    ok     ok     ok    ok    ok    401      ok
GET    /v2/models/{model_name}                                             401  ok    ok    ok     ok     ok    ok    ok    401      ok
GET    /v2/models/{model_name}/versions/{version}                          401  ok    ok    ok     ok     ok    ok    ok    401      ok
GET    /v2/models/{model_name}/ready                                       401  ok    ok    ok     ok     ok    ok    ok    401      ok
GET    /v2/models/{model_name}/versions/{version}/ready                    401  ok    ok    ok     ok     ok    ok    ok    401      ok
GET    /v2/models/{model_name}/config                                      401  ok    ok    ok     ok     ok    ok    ok    401      ok
GET    /v2/models/{model_name}/versions/{version}/config                   401  ok    ok    ok     ok     ok    ok    ok    401      ok
POST   /v2/models/{model_name}/infer                                       401  ok    ok    ok     ok     ok    ok    403   401      ok
POST   /v2/models/{model_name}/versions/{version}/infer                    401  ok    ok    ok     ok     ok    ok    403   401      ok
POST   /v2/models/{model_name}/generate                                    401  ok    ok    ok     ok     ok    ok    403   401      ok
POST   /v2/models/{model_name}/versions/{version}/generate                 401  ok    ok    ok     ok     ok    ok    403   401      ok
POST   /v2/models/{model_name}/generate_stream                             401  ok    ok    ok     ok     ok    ok    403   401      ok
POST   /v2/models/{model_name}/versions/{version}/generate_stream          401  ok    ok    ok     ok     ok    ok    403   401      ok
GET    /api/assistant/model                                                401  ok    ok    ok     ok     ok    ok    ok    401      ok
GET    /api/projects/{project_id}/assistant                                401  404   404   ok     ok     ok    ok    ok    401      403
PUT    /api/projects/{project_id}/assistant                                401  404   404   403    403    ok    403   403   401      403
POST   /api/projects/{project_id}/assistant/complete                       401  404   404   403    ok     ok    ok    403   401      403
POST   /api/projects/{project_id}/assistant/explain                        401  404   404   403    ok     ok    ok    403   401      403
POST   /api/projects/{project_id}/assistant/plain-words                   401  404   404   403    ok     ok    ok    403   401      403
POST   /api/projects/{project_id}/assistant/chat                           401  404   404   403    ok     ok    ok    403   401      403
# the sockets close non-members with 4403 whether or not the project exists, so nothing leaks
WS     /ws/collab/{project_id}/{file_path:path}                            401  403   403   ok     ok     ok    ok    403   401      403
WS     /ws/projects/{project_id}/events                                    401  403   403   ok     ok     ok    ok    403   ok       ok
GET    /api/projects/{project_id}/history                                  401  404   404   ok     ok     ok    ok    ok    ok       ok
POST   /api/projects/{project_id}/history                                  401  404   404   403    ok     ok    ok    403   401      403
GET    /api/projects/{project_id}/history/diff                             401  404   404   ok     ok     ok    ok    ok    ok       ok
GET    /api/projects/{project_id}/history/{version}/files/{path:path}      401  404   404   ok     ok     ok    ok    ok    ok       ok
POST   /api/projects/{project_id}/history/{version}/name                   401  404   404   403    ok     ok    ok    403   401      403
POST   /api/projects/{project_id}/history/restore                          401  404   404   403    ok     ok    ok    403   401      403
POST   /api/projects/{project_id}/runs                                     401  404   404   403    ok     ok    ok    403   401      403
POST   /api/projects/{project_id}/packages                                 401  404   404   403    ok     ok    ok    403   401      403
GET    /api/projects/{project_id}/runs                                     401  404   404   ok     ok     ok    ok    ok    401      403
# runs are for members only, even on a public project; an outsider's run id is hidden (404)
GET    /api/runs/{run_id}                                                  401  404   404   ok     ok     ok    ok    ok    401      404
POST   /api/runs/{run_id}/cancel                                           401  404   404   403    ok     ok    ok    403   401      404
WS     /ws/runs/{run_id}                                                   401  404   404   ok     ok     ok    ok    403   401      404
WS     /ws/projects/{project_id}/shell                                     401  404   404   403    ok     ok    ok    403   401      403
GET    /api/projects/{project_id}/secrets                                  401  404   404   403    ok     ok    ok    ok    401      403
PATCH  /api/projects/{project_id}/secrets                                  401  404   404   403    403    ok    403   403   401      403
PUT    /api/projects/{project_id}/secrets/{name}                           401  404   404   403    ok     ok    ok    403   401      403
DELETE /api/projects/{project_id}/secrets/{name}                           401  404   404   403    ok     ok    ok    403   401      403
POST   /api/projects/{project_id}/deployments                              401  404   404   403    ok     ok    ok    403   401      403
GET    /api/projects/{project_id}/deployment                               401  404   404   ok     ok     ok    ok    ok    401      403
POST   /api/projects/{project_id}/deployment/rollback                      401  404   404   403    ok     ok    ok    403   401      403
POST   /api/projects/{project_id}/deployment/scale                         401  404   404   403    ok     ok    ok    403   401      403
POST   /api/projects/{project_id}/deployment/stop                          401  404   404   403    ok     ok    ok    403   401      403
# the owner's 404: the project was never deployed (a real deploy would make this row build and start an app)
DELETE /api/projects/{project_id}/deployment                               401  404   404   403    403    404   403   403   401      403
WS     /ws/projects/{project_id}/deployment/logs                           401  404   404   403    ok     ok    ok    403   401      403
GET    /api/tutorials/courses                                              401  ok    ok    ok     ok     ok    ok    ok    401      ok
GET    /api/tutorials/lesson-projects                                      401  ok    ok    ok     ok     ok    ok    ok    401      ok
GET    /api/tutorials/courses/{course_slug}                                401  ok    ok    ok     ok     ok    ok    ok    401      ok
POST   /api/tutorials/courses/{course_slug}/lessons/{lesson_slug}/start    401  ok    ok    ok     ok     ok    ok    403   401      ok
POST   /api/tutorials/classrooms                                           401  ok    ok    ok     ok     ok    ok    403   401      ok
GET    /api/tutorials/classrooms                                           401  ok    ok    ok     ok     ok    ok    ok    401      ok
POST   /api/tutorials/classrooms/join                                      401  ok    ok    ok     ok     ok    ok    403   401      ok
GET    /api/tutorials/classrooms/{classroom_id}                            401  404   404   404    404    ok    404   ok    401      404
DELETE /api/tutorials/classrooms/{classroom_id}                            401  404   404   404    404    ok    404   403   401      404
DELETE /api/tutorials/classrooms/{classroom_id}/students/{username}        401  404   404   404    404    ok    404   403   401      404
GET    /api/tutorials/classrooms/{classroom_id}/grid                       401  404   404   404    404    ok    404   ok    401      404
GET    /api/projects/{project_id}/lesson                                   401  404   404   ok     ok     ok    ok    ok    401      403
POST   /api/projects/{project_id}/lesson/check                             401  404   404   403    ok     ok    ok    403   401      403
POST   /api/projects/{project_id}/lesson/hints                             401  404   404   403    ok     ok    ok    403   401      403
GET    /api/projects/{project_id}/lesson/solution                          401  404   404   ok     ok     ok    ok    ok    401      403
# page shells: the pages ask the API, which decides
GET    /                                                                   ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
GET    /login                                                              ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
GET    /register                                                           ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
GET    /dashboard                                                          ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
GET    /settings                                                           ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
GET    /projects/{project_id}                                              ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
GET    /invite/{token}                                                     ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
GET    /courses                                                            ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
GET    /courses/{slug}                                                     ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
GET    /classrooms                                                         ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
GET    /classrooms/{classroom_id}                                          ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
GET    /static                                                             ok   ok    ok    ok     ok     ok    ok    ok    ok       ok
"""

OUTCOMES = {"ok", "401", "403", "404"}
# Rows whose allowed call uses up what the path names (or the caller's session): fresh ones follow each "ok".
CONSUMING_METHODS = {"DELETE"}
SESSION_ENDING = {"POST /api/auth/logout"}
CONSUMING = SESSION_ENDING | {"POST /api/invites/{token}/accept"}
# Path parameters that name a project or something inside one (a scene makes the projects for them).
PROJECT_THINGS = {"project_id", "run_id", "name", "version", "invite_id", "token"}
PASSWORD = "matrix-pass-word"
FOREIGN_ORIGIN = "https://elsewhere.example"


def parse(table: str) -> dict[str, dict[str, str]]:
    """{"METHOD /path": {actor: outcome}} from the text table."""
    rows: dict[str, dict[str, str]] = {}
    for line in table.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        method, path, *cells = line.split()
        assert len(cells) == len(ACTORS), f"{method} {path}: {len(cells)} cells for {len(ACTORS)} callers"
        assert set(cells) <= OUTCOMES, f"{method} {path}: cells must be one of {sorted(OUTCOMES)}"
        rows[f"{method} {path}"] = dict(zip(ACTORS, cells))
    return rows


ROWS = parse(MATRIX)


def route_keys(app: FastAPI) -> dict[str, str]:
    """{"METHOD /path": URL template} for every route of the app (a mount answers GET)."""
    keys = {}
    for route in app_routes(app.routes):
        for method in route.methods or ("GET",):
            keys[f"{method} {route.path}"] = route.path_format if route.methods else route.path + "/{asset}"
    return keys


def missing_and_extra(app: FastAPI, rows: dict[str, dict[str, str]]) -> tuple[list[str], list[str]]:
    keys = route_keys(app)
    return sorted(set(keys) - set(rows)), sorted(set(rows) - set(keys))


@dataclass
class Caller:
    """How one actor calls: headers for HTTP and WebSockets, and whether writes carry the CSRF header."""

    headers: dict[str, str] = field(default_factory=dict)
    username: str = ""
    csrf: str = ""

    def http_headers(self, method: str) -> dict[str, str]:
        if self.csrf and method not in ("GET", "HEAD"):
            return {**self.headers, CSRF_HEADER: self.csrf}
        return self.headers


@dataclass
class Scene:
    """A private and a public project of the owner's, with the things the routes' paths name."""

    private: dict[str, str]  # path parameter -> value, project_id included
    public: dict[str, str]


class World:
    """The users, signed in, and the scene every row starts from; all calls go through one client whose
    event loop runs the app's lifespan (runs and rooms are tasks on that loop)."""

    def __init__(self, client: TestClient):
        self.client = client
        self.callers: dict[str, Caller] = {"anon": Caller()}
        for name in ("other", "viewer", "editor", "owner", "bystander"):
            self.callers[name] = self.sign_up()
        self.callers["admin"] = self.sign_up(admin=True)
        self.callers["token"] = self.with_token(self.sign_up())
        self.refresh_xsite()
        courses = self.call("owner", "GET", "/api/tutorials/courses").json()
        course = self.call("owner", "GET", f"/api/tutorials/courses/{courses[0]['slug']}").json()
        self.course = {"course_slug": course["slug"], "lesson_slug": course["lessons"][0]["slug"]}
        self.asset = "manifest.json"  # written by the web build (make web), which make test runs first
        every_param = {name for route in app_routes(client.app.routes) for name in route.params}
        self.base = self.new_scene(every_param, lessons=(course["lessons"][0]["slug"], course["lessons"][1]["slug"]))

    # ----- users -----

    def sign_up(self, admin: bool = False) -> Caller:
        username = f"m{secrets.token_hex(4)}"
        if admin:
            app = self.client.app
            with app.state.sessionmaker() as db:
                accounts.create_user(db, app.state.settings, username, PASSWORD, is_admin=True)
                db.commit()
        else:
            answer = self.client.post("/api/auth/register", json={"username": username, "password": PASSWORD})
            assert answer.status_code == 201, answer.text
        return self.sign_in(username)

    def sign_in(self, username: str) -> Caller:
        answer = self.client.post("/api/auth/login", json={"username": username, "password": PASSWORD})
        assert answer.status_code == 200, answer.text
        cookie = f"{SESSION_COOKIE}={answer.cookies[SESSION_COOKIE]}; {CSRF_COOKIE}={answer.cookies[CSRF_COOKIE]}"
        self.client.cookies.clear()  # each caller sends its own cookie header
        return Caller({"Cookie": cookie}, username, answer.cookies[CSRF_COOKIE])

    def with_token(self, caller: Caller) -> Caller:
        answer = self.call_as(caller, "POST", "/api/tokens", json={"name": "matrix"})
        return Caller({"Authorization": f"Bearer {answer.json()['token']}"}, caller.username)

    def refresh_xsite(self) -> None:
        owner = self.callers["owner"]
        self.callers["xsite"] = Caller({**owner.headers, "Origin": FOREIGN_ORIGIN}, owner.username)

    def renew_session(self, actor: str) -> None:
        """After a logout that worked: the actor signs in again (the owner's cookie is xsite's too)."""
        caller = self.callers[actor]
        if caller.csrf:
            self.callers[actor] = self.sign_in(caller.username)
            if actor == "owner":
                self.refresh_xsite()

    # ----- calls -----

    def call_as(self, caller: Caller, method: str, url: str, **kwargs):
        try:
            return self.client.request(method, url, headers=caller.http_headers(method), **kwargs)
        finally:
            self.client.cookies.clear()

    def call(self, actor: str, method: str, url: str, **kwargs):
        answer = self.call_as(self.callers[actor], method, url, **kwargs)
        assert answer.status_code < 400 or method != "POST" or actor != "owner", answer.text
        return answer

    # ----- scenes -----

    def new_scene(self, params: Iterable[str], lessons: tuple[str, str] | None = None) -> Scene:
        """Fresh things for the path parameters `params`: a private and a public project (lesson
        projects when `lessons` names two), each with what the routes name inside it."""
        private = self.things(params, public=False, lesson=lessons[0] if lessons else None)
        if not PROJECT_THINGS & set(params):
            return Scene(private, private)  # nothing in the path belongs to a project
        return Scene(private, self.things(params, public=True, lesson=lessons[1] if lessons else None))

    def things(self, params: Iterable[str], public: bool, lesson: str | None) -> dict[str, str]:
        params = set(params)
        values = {"model_name": "codeyard", "version": "1", "asset": self.asset, "slug": self.course["course_slug"],
                  "path": "matrix.py", "file_path": "matrix.py", "username": self.callers["bystander"].username, **self.course}
        if "token_id" in params:
            values["token_id"] = self.call("owner", "POST", "/api/tokens", json={"name": "spare"}).json()["id"]
        if "classroom_id" in params:
            classroom = self.call("owner", "POST", "/api/tutorials/classrooms",
                                  json={"name": "matrix", "courses": [self.course["course_slug"]]}).json()
            self.call("bystander", "POST", "/api/tutorials/classrooms/join", json={"code": classroom["join_code"]})
            values["classroom_id"] = classroom["id"]
        if not params & PROJECT_THINGS:
            return values
        project_id = values["project_id"] = self.project(public, lesson)
        base = f"/api/projects/{project_id}"
        if "invite_id" in params or "token" in params:
            invite = self.call("owner", "POST", f"{base}/invites", json={"role": "viewer"}).json()
            values["invite_id"], values["token"] = invite["id"], invite["token"]
        if "name" in params:
            self.call("owner", "PUT", f"{base}/secrets/MATRIX", json={"value": "s3cret"})
            values["name"] = "MATRIX"
        if "version" in params:
            values["version"] = self.call("owner", "POST", f"{base}/history", json={"message": "matrix"}).json()["version"]
        if "run_id" in params:
            values["run_id"] = self.finished_run(project_id)
        return values

    def project(self, public: bool, lesson: str | None) -> str:
        """A project of the owner's with matrix.py, its members added; a lesson's when `lesson` is given."""
        if lesson is None:
            project_id = self.call("owner", "POST", "/api/projects", json={"name": "matrix"}).json()["id"]
        else:
            start = f"/api/tutorials/courses/{self.course['course_slug']}/lessons/{lesson}/start"
            project_id = self.call("owner", "POST", start).json()["project_id"]
        base = f"/api/projects/{project_id}"
        assert self.call("owner", "PUT", f"{base}/files/content/matrix.py", content=b"print('hi')\n").status_code < 300
        if public:
            assert self.call("owner", "PATCH", base, json={"visibility": "public"}).status_code == 200
        app = self.client.app
        with app.state.sessionmaker() as db:
            for actor, role in (("viewer", Role.viewer), ("editor", Role.editor), ("token", Role.editor),
                                ("bystander", Role.viewer)):
                user_id = db.scalars(select(User.id).where(User.username == self.callers[actor].username)).one()
                db.add(Membership(project_id=project_id, user_id=user_id, role=role))
            db.commit()
        return project_id

    def finished_run(self, project_id: str) -> str:
        """A run of matrix.py, waited for (the run routes check the run's project)."""
        run = self.call("owner", "POST", f"/api/projects/{project_id}/runs", json={"entry": "matrix.py", "stdin": ""}).json()
        for _ in range(600):
            if self.call("owner", "GET", f"/api/runs/{run['id']}").json()["status"] == "finished":
                return str(run["id"])
            time.sleep(0.05)
        raise AssertionError("the run did not finish")


def outcome_of_status(status: int) -> str:
    return str(status) if status in (401, 403, 404) else "ok"


CLOSE_OUTCOMES = {4401: "401", 4403: "403", 4404: "404"}


def outcome(world: World, actor: str, method: str, url: str) -> str:
    """What one caller gets from one route; a server error fails the test whatever the table says."""
    caller = world.callers[actor.removesuffix("/pub")]
    if method == "WS":
        return ws_outcome(world.client, caller, url)
    kwargs = {"json": []} if method in ("POST", "PUT", "PATCH") else {}
    answer = world.call_as(caller, method, url, **kwargs)
    llm_off = answer.status_code == 503 and "switched off" in answer.text
    assert answer.status_code < 500 or llm_off, f"{actor}: {method} {url} -> {answer.status_code}: {answer.text[:300]}"
    return outcome_of_status(answer.status_code)


def ws_outcome(client: TestClient, caller: Caller, url: str) -> str:
    """A socket that is refused closes with 4401/4403/4404 (or is denied before it opens); one that is
    let in sends its first frame (presence, sync step 1, a run's output, a shell's prompt)."""
    try:
        with client.websocket_connect(url, headers=caller.headers) as socket:
            first = socket.receive()
    except WebSocketDenialResponse as denial:
        return outcome_of_status(denial.status_code)
    except WebSocketDisconnect as closed:
        return CLOSE_OUTCOMES.get(closed.code, "ok")
    finally:
        client.cookies.clear()
    if first["type"] == "websocket.close":
        return CLOSE_OUTCOMES.get(first.get("code", 1000), "ok")
    return "ok"


def answers(world: World, key: str, template: str) -> dict[str, str]:
    """What each caller gets from one route, in the table's column order."""
    method = key.split(" ", 1)[0]
    consuming = method in CONSUMING_METHODS or key in CONSUMING
    params = [name for _, name, _, _ in Formatter().parse(template) if name]
    scene = world.new_scene(params) if consuming else world.base
    got = {}
    for actor in ACTORS:
        things = scene.public if actor.endswith("/pub") else scene.private
        got[actor] = outcome(world, actor, method, template.format(**things))
        if got[actor] == "ok" and key in SESSION_ENDING:
            world.renew_session(actor.removesuffix("/pub"))
        if got[actor] == "ok" and consuming:
            scene = world.new_scene(params)
    return got


def row_text(key: str, cells: dict[str, str]) -> str:
    method, path = key.split(" ", 1)
    return f"{method:<7}{path:<68}" + "".join(f"{cells[actor]:<{len(actor) + 1}}" for actor in ACTORS).rstrip()


def disagreements(world: World, rows: dict[str, dict[str, str]]) -> list[str]:
    """Every cell where the app answers otherwise than the table, and the row as the app answers it."""
    templates = route_keys(world.client.app)
    wrong = []
    for key, expected in rows.items():
        got = answers(world, key, templates[key])
        cells = [f"{key}: {actor} gets {got[actor]}, the table says {expected[actor]}"
                 for actor in ACTORS if got[actor] != expected[actor]]
        wrong += cells + ([f"    the app answers: {row_text(key, got)}"] if cells else [])
    return wrong


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[World]:
    data_dir = tmp_path_factory.mktemp("matrix")
    settings = Settings(data_dir=data_dir, database_url=f"sqlite:///{data_dir / 'codeyard.db'}",
                        sandbox_backend="bwrap", llm_model="off", log_level="warning")
    application = create_app(settings)
    with TestClient(application) as client:
        yield World(client)
    application.state.engine.dispose()


def test_the_table_has_a_row_for_every_route(world):
    missing, extra = missing_and_extra(world.client.app, ROWS)
    assert not missing, "routes without a row in MATRIX (add one):\n" + "\n".join(missing)
    assert not extra, "rows in MATRIX for routes the app does not have:\n" + "\n".join(extra)


@pytest.mark.timeout(120)
def test_every_route_answers_every_caller_as_the_table_says(world):
    wrong = disagreements(world, ROWS)
    assert not wrong, "\n".join(wrong)


def test_a_route_that_forgets_its_check_fails_the_matrix(world):
    """A project route guarded only by "signed in" and a socket that checks nothing: both lack a row,
    and the rows their author meant (members, or anyone on a public project) disagree with the app."""
    app = world.client.app
    router = APIRouter()

    @router.get("/api/projects/{project_id}/forgetful")
    def forgetful(project_id: str, user: CurrentUser) -> dict[str, str]:
        return {"project": project_id}

    @router.websocket("/ws/projects/{project_id}/forgetful")
    async def forgetful_socket(websocket: WebSocket, project_id: str) -> None:
        await websocket.accept()
        await websocket.send_json({"project": project_id})
        await websocket.close()

    before = list(app.router.routes)
    app.include_router(router)
    try:
        missing, _ = missing_and_extra(app, ROWS)
        assert missing == ["GET /api/projects/{project_id}/forgetful", "WS /ws/projects/{project_id}/forgetful"]
        meant = {"GET /api/projects/{project_id}/forgetful": "401 404 404 ok ok ok ok ok ok ok",
                 "WS /ws/projects/{project_id}/forgetful": "401 403 403 ok ok ok ok 403 ok ok"}
        wrong = disagreements(world, {key: dict(zip(ACTORS, row.split())) for key, row in meant.items()})
    finally:
        app.router.routes[:] = before
    assert [line.split(", the table")[0] for line in wrong if not line.startswith(" ")] == [
        "GET /api/projects/{project_id}/forgetful: other gets ok",
        "GET /api/projects/{project_id}/forgetful: admin gets ok",
        "GET /api/projects/{project_id}/forgetful: anon/pub gets 401",
        "WS /ws/projects/{project_id}/forgetful: anon gets ok",
        "WS /ws/projects/{project_id}/forgetful: other gets ok",
        "WS /ws/projects/{project_id}/forgetful: admin gets ok",
        "WS /ws/projects/{project_id}/forgetful: xsite gets ok",
    ]
