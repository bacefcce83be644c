"""Every API route, enumerated from the app itself, answers per its declared access rule.

Each /api route is called as an anonymous caller, a signed-in non-member and a viewer, against a
private and a public project of another user (other documented routes, such as the LLM's /v1,
as an anonymous caller). Denials must be 401 (anonymous), 404 (a private
project you are not in) or 403 (a project you can see but not change), and no answer to an
outsider may contain the owner's data. A route without an access rule fails the first test.
"""

import secrets
import sys
import types
from dataclasses import dataclass

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse

from ide_server.access import API_PREFIX, AccessRule, RouteInfo, guarded_routes, unguarded_routes
from ide_server.app import create_app
from ide_server.components import Component
from ide_server.models import Role

DOCS = {"/api/openapi.json", "/api/docs"}


@dataclass
class World:
    owner: TestClient
    viewer: TestClient
    stranger: TestClient
    anon: TestClient
    private_id: str
    public_id: str
    fillers: dict[str, str]
    markers: list[str]
    secret: bytes
    owner_token: str


@pytest.fixture(scope="module")
def world(app) -> World:
    def user() -> tuple[TestClient, str]:
        name = f"acl{secrets.token_hex(4)}"
        client = TestClient(app)
        csrf = client.post("/api/auth/register", json={"username": name, "password": "pass-word-1"}).json()["csrf_token"]
        token = client.post("/api/tokens", json={"name": "t"}, headers={"X-CSRF-Token": csrf}).json()["token"]
        # Outsiders use Bearer tokens so that calling /auth/logout doesn't sign them out mid-test.
        return TestClient(app, headers={"Authorization": f"Bearer {token}"}), name

    owner, owner_name = user()
    viewer, _ = user()
    stranger, _ = user()
    marker = f"SECRET{secrets.token_hex(6)}"
    private = owner.post("/api/projects", json={"name": f"{marker}-private"}).json()["id"]
    public = owner.post("/api/projects", json={"name": f"{marker}-public"}).json()["id"]
    owner.patch(f"/api/projects/{public}", json={"visibility": "public"})
    secret = f"{marker}-file-content".encode()
    for pid in (private, public):
        owner.put(f"/api/projects/{pid}/files/content/secret.txt", content=secret)
    link = owner.post(f"/api/projects/{private}/invites", json={"role": "viewer"}).json()
    assert viewer.post(f"/api/invites/{link['token']}/accept").status_code == 200
    extra_token = owner.post("/api/tokens", json={"name": "other"}).json()
    fillers = {
        "path": "secret.txt",
        "username": owner_name,
        "token_id": extra_token["id"],
        "invite_id": link["id"],
        "token": "not-a-real-invite-token",
    }
    return World(
        owner=owner, viewer=viewer, stranger=stranger, anon=TestClient(app),
        private_id=private, public_id=public, fillers=fillers,
        markers=[marker, link["token"], extra_token["token"]], secret=secret,
        owner_token=owner.headers["Authorization"],
    )


def url_for(route: RouteInfo, project_id: str, fillers: dict[str, str]) -> str:
    values = {name: fillers.get(name, "no-such-thing") for name in route.params}
    values["project_id"] = project_id
    return route.path_format.format(**values)


def call(client: TestClient, method: str, url: str):
    """(status, body text) of one call; WebSocket routes report their denial status, or 101."""
    if method == "WS":
        try:
            with client.websocket_connect(url):
                return 101, ""
        except WebSocketDenialResponse as denial:
            return denial.status_code, denial.text
    kwargs = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
    response = client.request(method, url, **kwargs)
    return response.status_code, response.text


def expected(rule: AccessRule, who: str, project_public: bool) -> set[int] | None:
    """The statuses a caller must get, or None where the rule lets them through."""
    on_project = rule.project_role is not None
    readable = on_project and project_public and rule.public_read
    if who == "anon":
        return {401} if rule.signed_in or (on_project and not readable) else None
    if not on_project:
        return None
    if who == "stranger":
        if not project_public:
            return {404}
        return None if readable else {403}
    # viewer of the (private) project
    return {403} if rule.project_role.rank > Role.viewer.rank else None


def test_every_api_route_declares_an_access_rule(app):
    routes = guarded_routes(app.routes, exempt=DOCS)
    assert len([r for r in routes if r.path.startswith(API_PREFIX)]) >= 25
    assert unguarded_routes(app.routes, exempt=DOCS) == []
    for route in routes:
        assert route.rule is not None, f"{route.path} has no access rule"
        if "project_id" in route.params:
            assert route.rule.project_role is not None, f"{route.path} does not check the project"


# Writes that a reader may make: forking copies a project you can read into one of your own.
READER_WRITES = {("POST", "/api/projects/{project_id}/fork")}
# Writes open to anonymous callers: signing up and signing in.
ANONYMOUS_WRITES = {("POST", "/api/auth/register"), ("POST", "/api/auth/login")}


def test_rules_follow_the_policy_writes_need_editors(app):
    """A route can't declare itself weaker than the policy: project writes need an editor."""
    for route in guarded_routes(app.routes, exempt=DOCS):
        for method in route.methods:
            if method in ("GET", "WS"):
                continue
            key = (method, route.path)
            if key in ANONYMOUS_WRITES:
                assert not route.rule.signed_in
                continue
            assert route.rule.signed_in, f"{method} {route.path} lets anonymous callers write"
            if route.rule.project_role is not None and key not in READER_WRITES:
                assert route.rule.project_role.rank >= Role.editor.rank, f"{method} {route.path} lets viewers write"


@pytest.mark.parametrize(
    ("who", "visibility"),
    # The viewer is a member of the private project only.
    [("anon", "private"), ("stranger", "private"), ("viewer", "private"), ("anon", "public"), ("stranger", "public")],
)
def test_every_api_route_answers_outsiders_per_its_rule(app, world, who, visibility):
    client = getattr(world, who)
    project_id = world.private_id if visibility == "private" else world.public_id
    failures = []
    checked = 0
    for route in guarded_routes(app.routes, exempt=DOCS):
        if who != "anon" and not route.path.startswith(API_PREFIX):
            continue  # other components' routes (e.g. /v1, which loads a model) get the anonymous check
        rule = route.rule
        url = url_for(route, project_id, world.fillers)
        for method in route.methods:
            status, body = call(client, method, url)
            checked += 1
            must = expected(rule, who, visibility == "public")
            where = f"{who}: {method} {route.path} -> {status}"
            if status >= 500:
                failures.append(f"{where} (server error)")
            elif must is not None and status not in must:
                failures.append(f"{where}, expected {sorted(must)}: {body[:200]}")
            elif must is None and status in (401, 403):
                failures.append(f"{where}, but the rule {rule} lets this caller in")
            if who != "viewer" and (visibility == "private" or must is not None):
                leaked = [m for m in world.markers if m in body]
                if leaked or world.secret.decode() in body:
                    failures.append(f"{where} leaks the owner's data: {body[:200]}")
    assert checked >= 25
    assert not failures, "\n".join(failures)


def test_outsiders_changed_nothing_of_the_owner(world):
    """Run after the sweeps: the owner's projects, files, members, invite and tokens are intact."""
    owner = world.owner
    projects = {p["id"] for p in owner.get("/api/projects").json()}
    assert {world.private_id, world.public_id} <= projects
    for pid in (world.private_id, world.public_id):
        assert owner.get(f"/api/projects/{pid}/files/content/secret.txt").content == world.secret
    members = {m["role"] for m in owner.get(f"/api/projects/{world.private_id}/members").json()}
    assert members == {"owner", "viewer"}
    assert [i["id"] for i in owner.get(f"/api/projects/{world.private_id}/invites").json()] == [world.fillers["invite_id"]]
    assert world.fillers["token_id"] in {t["id"] for t in owner.get("/api/tokens").json()}


def test_a_component_with_an_unguarded_route_stops_the_app(settings):
    router = APIRouter(prefix="/api")

    @router.get("/oops")
    def oops() -> dict:
        return {"everyone": "sees this"}

    module = types.ModuleType("codeyard_test_unguarded")
    module.component = Component(name="oops", router=router)
    sys.modules[module.__name__] = module
    try:
        with pytest.raises(RuntimeError, match=r"without an access rule.*GET /api/oops"):
            create_app(settings, component_specs=["ide_server.api.health:component", "codeyard_test_unguarded:component"])
    finally:
        del sys.modules[module.__name__]


def test_a_route_added_after_startup_without_a_rule_is_reported(app):
    extra = FastAPI()
    extra.router.routes.extend(app.routes)

    @extra.post("/api/projects/{project_id}/sneaky")
    def sneaky(project_id: str) -> dict:
        return {}

    @extra.get("/v2/documented")
    def documented() -> dict:
        return {}

    @extra.get("/page", include_in_schema=False)
    def page() -> dict:
        return {}

    assert unguarded_routes(extra.routes, exempt=DOCS) == [
        "POST /api/projects/{project_id}/sneaky", "GET /v2/documented"]
