"""Collaboration as an ide_server component: the /ws/collab websocket and the process's rooms.

The handler is thin: accept, authenticate (session cookie or Bearer token), look up the role,
then hand the socket to collab.websocket.serve_websocket. Under `serve --workers`, a socket for a
project whose rooms another worker hosts is relayed there first (Settings.rooms_worker). Failures close with 4401 (not signed
in) or 4403 (no access, bad path) after accepting, so y-websocket clients can tell them apart.
Other parts of the app get the rooms from the composition root (`open_collab` builds them; runs and
deploys take them as constructor arguments, the history API through `rooms_of`). The files API and
membership changes reach them through the project events hub (one notification mechanism for the
whole app): a written file is merged into its open room at once, a deleted or moved one loses its
room, and a member who was removed or whose role changed is disconnected. `open_collab` also starts
the automatic checkpoints (a git commit after a pause in editing).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import APIRouter, FastAPI, WebSocket
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from collab.fanout import Fanout
from collab.history import Author, AutoCheckpointer, Histories, user_author
from collab.room import RoomKey
from collab.rooms import CLOSE_FORBIDDEN, RoomManager
from collab.store import UpdateStore
from collab.websocket import serve_websocket
from ide_server import paths
from ide_server.components import Component
from ide_server.deps import authenticate_websocket, project_role
from ide_server.errors import InvalidInput, NotAuthenticated, PermissionDenied
from ide_server.events import ProjectEvents
from ide_server.models import Role, User
from ide_server.services.projects import project_dir
from ide_server.settings import Settings
from ide_server.wiring import Builders, Collab, Core, required, services_of
from ide_server.ws_relay import relay_to

CLOSE_UNAUTHENTICATED = 4401
# The user's role changed: reconnect (and get the new role). Clients stop only on 4401/4403.
CLOSE_ROLE_CHANGED = 4000

log = logging.getLogger(__name__)
router = APIRouter()


def rooms_of(app: FastAPI) -> RoomManager:
    return required(services_of(app.state).rooms, "collab")


def histories_of(app: FastAPI) -> Histories:
    return required(services_of(app.state).histories, "collab")


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
    if (host := websocket.app.state.settings.rooms_worker(project_id)) and await relay_to(websocket, host):
        return  # served by the worker hosting the project's rooms, which checks who asks (if it is down: here)
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


class AppEvents:
    """What the rooms do when the app reports a change (subscribed to the project events hub)."""

    def __init__(self, sessions: sessionmaker[Session], rooms: RoomManager) -> None:
        self.sessions = sessions
        self.rooms = rooms

    async def files_changed(self, project_id: str, action: str, path: str, to: str | None) -> None:
        try:
            if action in ("delete", "move"):
                for key in self.rooms.open_keys(project_id, path):
                    await self.rooms.forget(key)
                await self.rooms.forget(RoomKey(project_id, path))  # also drop a closed room's document
            else:
                for key in self.rooms.open_keys(project_id, path):
                    await self.rooms.file_changed(key)
        except Exception:  # the disk poller still catches a written file
            log.exception("applying %s of %s/%s to the rooms failed", action, project_id, path)

    async def access_changed(self, project_id: str, user_id: int) -> None:
        role = await run_in_threadpool(self._role, project_id, user_id)
        code = CLOSE_FORBIDDEN if role is None else CLOSE_ROLE_CHANGED
        await self.rooms.close_user(project_id, str(user_id), code)

    def author(self, user_id: str) -> Author:
        """The git author of a user's edits (for automatic checkpoints; blocking: call it in a thread)."""
        user = self._user(int(user_id))
        return user_author(user.username if user is not None else f"user{user_id}")

    def _role(self, project_id: str, user_id: int) -> Role | None:
        with self.sessions() as db:
            return project_role(db, project_id, db.get(User, user_id))

    def _user(self, user_id: int) -> User | None:
        with self.sessions() as db:
            return db.get(User, user_id)


@asynccontextmanager
async def open_collab(core: Core, *, events: ProjectEvents | None) -> AsyncIterator[Collab]:
    """The projects' histories, the rooms (subscribed to the events hub) and their automatic checkpoints."""
    settings = core.settings
    histories = Histories(
        lambda project_id: project_dir(settings.projects_dir, project_id),
        lambda project_id: settings.data_dir / "history" / f"{project_id}.git",  # never inside the project
    )
    fanout = Fanout(settings.redis_url) if settings.redis_url else None
    rooms = RoomManager(UpdateStore(core.engine), lambda key: file_on_disk(settings, key), fanout=fanout)
    app_events = AppEvents(core.sessions, rooms)
    checkpoints = AutoCheckpointer(rooms, histories.of, app_events.author)
    rooms.on_edit = checkpoints.edited  # before any room opens
    if events is not None:
        events.on_files_changed(app_events.files_changed)
        events.on_access_changed(app_events.access_changed)
    try:
        yield Collab(histories, rooms, checkpoints)
    finally:
        await checkpoints.close()
        await rooms.shutdown()
        if fanout:
            await fanout.close()


component = Component(name="collab", router=router, builds=Builders(collab=open_collab))
