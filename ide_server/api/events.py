"""Project events: WebSocket /ws/projects/{project_id}/events (file tree changes and presence).

Why a separate channel: the collab rooms are per file, but the file tree and "who is in this
project, in which file" are per project. Every open workspace keeps one socket here; the files API
publishes a `files` event after each mutation and the workspace re-reads the tree. Presence is
the list of connected users with the file each one has open; clients announce their file with
{"type": "presence", "file": path | null}. Runs announce here too: {"type": "run", "id", "username"}
when one starts (every member's console follows it) and a `files` event when one wrote files. Parts of the app subscribe in-process to the same
notifications (`on_files_changed`, `on_access_changed`): the collab rooms merge a file written
through the API at once, and close the sockets of a member who was removed or downgraded.
The hub lives in this process (one replica). With several replicas (Redis), membership changes reach
every replica's subscribers (`ide_server.events_fanout`), so a removed member's sockets close wherever
they are; files and presence events stay per replica (the collab rooms share edits themselves).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from starlette.concurrency import run_in_threadpool

from ide_server.components import Component
from ide_server.deps import authenticate_websocket
from ide_server.errors import DomainError, NotAuthenticated
from ide_server.events import Listener, ProjectEvents
from ide_server.events_fanout import AccessFanout
from ide_server.models import Role
from ide_server.services import projects
from ide_server.wiring import Builders, Core, required, services_of

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
MAX_MESSAGE = 4096

router = APIRouter()


def _authorise(websocket: WebSocket, project_id: str) -> tuple[str, str]:
    """(username, role) of a caller allowed to read the project; raises a DomainError otherwise."""
    app = websocket.app
    with app.state.sessionmaker() as db:
        user = authenticate_websocket(websocket, db, app.state.settings)
        access = projects.authorize(db, project_id, user, Role.viewer, public_read=True)
        username = user.username if user is not None else "guest"
        return username, access.role.value if access.role is not None else "viewer"


@router.websocket("/ws/projects/{project_id}/events")
async def project_events_socket(websocket: WebSocket, project_id: str) -> None:
    await websocket.accept()
    try:
        username, role = await run_in_threadpool(_authorise, websocket, project_id)
    except NotAuthenticated as exc:
        await websocket.close(CLOSE_UNAUTHENTICATED, exc.detail[:120])
        return
    except DomainError as exc:
        await websocket.close(CLOSE_FORBIDDEN, exc.detail[:120])
        return
    hub = required(services_of(websocket.app.state).events, "events")
    listener = Listener(websocket, username, role)
    await hub.join(project_id, listener)
    try:
        while True:
            text = await websocket.receive_text()
            if len(text) > MAX_MESSAGE:
                continue
            try:
                message = json.loads(text)
            except ValueError:
                continue
            if isinstance(message, dict) and message.get("type") == "presence":
                file = message.get("file")
                await hub.moved_to(project_id, listener, file if isinstance(file, str) else None)
    except WebSocketDisconnect:
        pass
    finally:
        await hub.leave(project_id, listener)


@asynccontextmanager
async def open_events(core: Core) -> AsyncIterator[ProjectEvents]:
    """The hub, delivering on the serving loop; with replicas, access changes fan out through Redis."""
    hub = ProjectEvents()
    hub.start(asyncio.get_running_loop())
    redis_url = core.settings.redis_url
    if not redis_url:
        yield hub
        return
    fanout = AccessFanout(redis_url, hub.access_changed_elsewhere)
    await fanout.start()
    hub.publish_access = fanout.publish
    try:
        yield hub
    finally:
        hub.publish_access = None
        await fanout.close()


component = Component(name="events", router=router, builds=Builders(events=open_events))
