"""Plugging a feature in as a Component: its router, lifespan, and WebSocket authentication."""

import sys
import types
from contextlib import asynccontextmanager

import pytest
from fastapi import APIRouter, FastAPI, WebSocket
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse

from ide_server.app import create_app
from ide_server.components import COMPONENTS, Component
from ide_server.deps import (
    DbSession,
    OptionalUser,
    ProjectEditor,
    Public,
    SettingsDep,
    authenticate_websocket,
    project_role,
)

router = APIRouter(prefix="/api")
events: list[str] = []


@router.websocket("/projects/{project_id}/echo")
async def echo(websocket: WebSocket, ctx: ProjectEditor, db: DbSession) -> None:
    """A project WebSocket guarded by the same dependency as the HTTP routes."""
    await websocket.accept()
    await websocket.send_json({"user": ctx.user.username, "role": ctx.role, "holds_db": db.in_transaction()})
    await websocket.close()


@router.websocket("/whoami", dependencies=[Public])
async def whoami(websocket: WebSocket, db: DbSession, settings: SettingsDep) -> None:
    user = authenticate_websocket(websocket, db, settings)
    await websocket.accept()
    role = project_role(db, websocket.query_params.get("project", ""), user)
    await websocket.send_json({"user": user.username if user else None, "role": role})
    await websocket.close()


@router.get("/hello", dependencies=[Public])
def hello(user: OptionalUser) -> dict:
    return {"user": user.username if user else None}


@asynccontextmanager
async def lifespan(app: FastAPI):
    events.append("started")
    yield
    events.append("stopped")


@pytest.fixture(scope="module")
def plugged_app(settings):
    module = types.ModuleType("codeyard_test_demo")
    module.component = Component(name="demo", router=router, lifespan=lifespan)
    sys.modules[module.__name__] = module
    try:
        app = create_app(settings, component_specs=[*COMPONENTS, "codeyard_test_demo:component"])
    finally:
        del sys.modules[module.__name__]
    with TestClient(app):
        assert events[-1] == "started"
        yield app
    assert events[-1] == "stopped"
    app.state.engine.dispose()


def denial_status(client: TestClient, url: str, **kwargs) -> int:
    with pytest.raises(WebSocketDenialResponse) as denial:
        with client.websocket_connect(url, **kwargs):
            pass
    return denial.value.status_code


def test_project_websockets_use_the_same_access_rules(plugged_app, new_user):
    owner, viewer, stranger = new_user(), new_user(), new_user()
    pid = owner.post("/api/projects", json={"name": "ws"}).json()["id"]
    link = owner.post(f"/api/projects/{pid}/invites", json={"role": "viewer"}).json()["token"]
    viewer.post(f"/api/invites/{link}/accept")

    with TestClient(plugged_app, cookies=dict(owner.cookies)).websocket_connect(f"/api/projects/{pid}/echo") as ws:
        # The socket doesn't keep the handshake's database transaction (and connection) open.
        assert ws.receive_json() == {"user": owner.username, "role": "owner", "holds_db": False}
    token = owner.post("/api/tokens", json={"name": "ws"}).json()["token"]
    bearer = TestClient(plugged_app, headers={"Authorization": f"Bearer {token}"})
    with bearer.websocket_connect(f"/api/projects/{pid}/echo") as ws:
        assert ws.receive_json()["user"] == owner.username

    assert denial_status(TestClient(plugged_app), f"/api/projects/{pid}/echo") == 401
    assert denial_status(TestClient(plugged_app, cookies=dict(stranger.cookies)), f"/api/projects/{pid}/echo") == 404
    assert denial_status(TestClient(plugged_app, cookies=dict(viewer.cookies)), f"/api/projects/{pid}/echo") == 403
    evil = {"Origin": "https://evil.example"}
    owner_cookie = TestClient(plugged_app, cookies=dict(owner.cookies))
    assert denial_status(owner_cookie, f"/api/projects/{pid}/echo", headers=evil) == 403
    with bearer.websocket_connect(f"/api/projects/{pid}/echo", headers=evil) as ws:  # tokens aren't ambient
        assert ws.receive_json()["user"] == owner.username


def test_authenticate_websocket_and_project_role(plugged_app, new_user):
    alice = new_user()
    pid = alice.post("/api/projects", json={"name": "ws2"}).json()["id"]
    cookie_client = TestClient(plugged_app, cookies=dict(alice.cookies))
    with cookie_client.websocket_connect(f"/api/whoami?project={pid}", headers={"Origin": "http://testserver"}) as ws:
        assert ws.receive_json() == {"user": alice.username, "role": "owner"}
    with TestClient(plugged_app).websocket_connect("/api/whoami") as ws:
        assert ws.receive_json() == {"user": None, "role": None}
    # A cookie sent by another site's page is refused (cross-site WebSocket hijacking).
    assert denial_status(cookie_client, "/api/whoami", headers={"Origin": "https://evil.example"}) == 403
    bad_token = TestClient(plugged_app, headers={"Authorization": "Bearer cy_wrong"})
    assert denial_status(bad_token, "/api/whoami") == 401


def test_websocket_routes_are_in_the_access_sweep(plugged_app):
    from ide_server.access import guarded_routes

    routes = {r.path: r for r in guarded_routes(plugged_app.routes, exempt=set())}
    assert routes["/api/projects/{project_id}/echo"].methods == ("WS",)
    assert routes["/api/projects/{project_id}/echo"].rule.project_role == "editor"
    assert routes["/api/whoami"].rule.signed_in is False


def test_optional_user_on_a_public_route(plugged_app, new_user):
    alice = new_user()
    assert TestClient(plugged_app).get("/api/hello").json() == {"user": None}
    assert TestClient(plugged_app, cookies=dict(alice.cookies)).get("/api/hello").json() == {"user": alice.username}
