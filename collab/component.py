"""Collaboration as an ide_server component: the /ws/collab websocket and the process's rooms.

The handler is thin: accept, authenticate (session cookie or Bearer token), look up the role,
then hand the socket to collab.websocket.serve_websocket. Failures close with 4401 (not signed
in) or 4403 (no access, bad path) after accepting, so y-websocket clients can tell them apart.
Other parts of the app reach the rooms through `rooms_of(app)` (files API, history restore,
membership changes).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import APIRouter, FastAPI, WebSocket
from starlette.concurrency import run_in_threadpool

from collab.fanout import Fanout
from collab.room import RoomKey
from collab.rooms import RoomManager
from collab.store import UpdateStore
from collab.websocket import serve_websocket
from ide_server import paths
from ide_server.components import Component
from ide_server.deps import authenticate_websocket, project_role
from ide_server.errors import InvalidInput, NotAuthenticated, PermissionDenied
from ide_server.models import Role
from ide_server.services.projects import project_dir
from ide_server.settings import Settings

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403

router = APIRouter()


def rooms_of(app: FastAPI) -> RoomManager:
    return app.state.collab_rooms


def file_on_disk(settings: Settings, key: RoomKey) -> Path:
    """The room's file inside its project; InvalidInput if a symlink leads outside."""
    return paths.resolve(project_dir(settings.projects_dir, key.project_id), key.file_path)


def _authorise(websocket: WebSocket, project_id: str) -> tuple[str, Role]:
    """(user id, role) of the caller; raises NotAuthenticated or PermissionDenied."""
    app = websocket.app
    with app.state.sessionmaker() as db:
        user = authenticate_websocket(websocket, db, app.state.settings)
        if user is None:
            raise NotAuthenticated("sign in to edit files together")
        role = project_role(db, project_id, user)
    if role is None:
        raise PermissionDenied("you are not a member of this project")
    return str(user.id), role


@router.websocket("/ws/collab/{project_id}/{file_path:path}")
async def collab_socket(websocket: WebSocket, project_id: str, file_path: str) -> None:
    await websocket.accept()
    try:
        user_id, role = await run_in_threadpool(_authorise, websocket, project_id)
        key = RoomKey(project_id, paths.normalise(file_path))
        file_on_disk(websocket.app.state.settings, key)
    except NotAuthenticated as exc:
        await websocket.close(CLOSE_UNAUTHENTICATED, exc.detail[:120])
        return
    except (PermissionDenied, InvalidInput) as exc:
        await websocket.close(CLOSE_FORBIDDEN, exc.detail[:120])
        return
    await serve_websocket(
        websocket, rooms_of(websocket.app), key, can_write=role.at_least(Role.editor), user_id=user_id
    )


@asynccontextmanager
async def collab_lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    fanout = Fanout(settings.redis_url) if settings.redis_url else None
    rooms = RoomManager(UpdateStore(app.state.engine), lambda key: file_on_disk(settings, key), fanout=fanout)
    app.state.collab_rooms = rooms
    try:
        yield
    finally:
        await rooms.shutdown()
        if fanout:
            await fanout.close()


component = Component(name="collab", router=router, lifespan=collab_lifespan)
