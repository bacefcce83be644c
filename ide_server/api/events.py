"""Project events: WebSocket /ws/projects/{project_id}/events (file tree changes and presence).

Why a separate channel: the collab rooms are per file, but the file tree and "who is in this
project, in which file" are per project. Every open workspace keeps one socket here; the files API
publishes a `files` event after each mutation and the workspace re-reads the tree. Presence is
the list of connected users with the file each one has open; clients announce their file with
{"type": "presence", "file": path | null}. Runs announce here too: {"type": "run", "id", "username"}
when one starts (every member's console follows it) and a `files` event when one wrote files. Parts of the app subscribe in-process to the same
notifications (`on_files_changed`, `on_access_changed`): the collab rooms merge a file written
through the API at once, and close the sockets of a member who was removed or downgraded.
The hub lives in this process (one replica); with several replicas, events would need the Redis
fan-out the collab rooms use (the rooms already share access revocations that way).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, WebSocket, WebSocketDisconnect
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from ide_server.components import Component
from ide_server.deps import authenticate_websocket
from ide_server.errors import DomainError, NotAuthenticated
from ide_server.models import Role
from ide_server.services import projects

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
MAX_MESSAGE = 4096

router = APIRouter()

# (project_id, action, path, to) and (project_id, user_id): the in-process subscribers' signatures.
FilesSubscriber = Callable[[str, str, str, str | None], Awaitable[None]]
AccessSubscriber = Callable[[str, int], Awaitable[None]]


@dataclass(eq=False)
class Listener:
    """One open workspace: who it is, which file it shows, and where to send events."""

    websocket: WebSocket
    username: str
    role: str
    file: str | None = None
    id: int = field(default_factory=itertools.count(1).__next__)


class ProjectEvents:
    """The listeners of each project, and broadcasting to them (safe to call from worker threads).

    Created with the app (so other components can subscribe in their setup or lifespan, in any
    order); events are delivered once `start` has given it the serving event loop.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listeners: dict[str, set[Listener]] = {}
        self._files_subscribers: list[FilesSubscriber] = []
        self._access_subscribers: list[AccessSubscriber] = []
        self._tasks: set[asyncio.Task] = set()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def on_files_changed(self, subscriber: FilesSubscriber) -> None:
        self._files_subscribers.append(subscriber)

    def on_access_changed(self, subscriber: AccessSubscriber) -> None:
        self._access_subscribers.append(subscriber)

    def files_changed(self, project_id: str, action: str, path: str, to: str | None = None) -> None:
        """Tell the project's open workspaces and the subscribers that its files changed (files API)."""
        event = {"type": "files", "action": action, "path": path, "to": to}
        self._submit(lambda: [self._broadcast(project_id, event)]
                     + [subscriber(project_id, action, path, to) for subscriber in self._files_subscribers])

    def announce(self, project_id: str, event: dict) -> None:
        """Send an event to the project's open workspaces only (runs: one started, one wrote files); the
        in-process subscribers are not told, as the collab rooms notice files written by runs on disk."""
        self._submit(lambda: [self._broadcast(project_id, event)])

    def access_changed(self, project_id: str, user_id: int) -> None:
        """A member was removed or their role changed (called after the change is committed)."""
        self._submit(lambda: [subscriber(project_id, user_id) for subscriber in self._access_subscribers])

    def _submit(self, make: Callable[[], list[Coroutine]]) -> None:
        if self._loop is not None and not self._loop.is_closed():  # else the app is not serving
            self._loop.call_soon_threadsafe(self._spawn, make)

    def _spawn(self, make: Callable[[], list[Coroutine]]) -> None:
        for coroutine in make():
            task = asyncio.create_task(coroutine)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def join(self, project_id: str, listener: Listener) -> None:
        self._listeners.setdefault(project_id, set()).add(listener)
        await self._broadcast_presence(project_id)

    async def leave(self, project_id: str, listener: Listener) -> None:
        listeners = self._listeners.get(project_id, set())
        listeners.discard(listener)
        if not listeners:
            self._listeners.pop(project_id, None)
        await self._broadcast_presence(project_id)

    async def moved_to(self, project_id: str, listener: Listener, file: str | None) -> None:
        listener.file = file
        await self._broadcast_presence(project_id)

    async def _broadcast_presence(self, project_id: str) -> None:
        users = [
            {"id": other.id, "username": other.username, "role": other.role, "file": other.file}
            for other in sorted(self._listeners.get(project_id, ()), key=lambda item: item.id)
        ]
        await self._broadcast(project_id, {"type": "presence", "users": users})

    async def _broadcast(self, project_id: str, event: dict) -> None:
        text = json.dumps(event)
        for listener in list(self._listeners.get(project_id, ())):
            try:
                await listener.websocket.send_text(text)
            except Exception:  # a socket closing meanwhile; its handler removes it
                pass


async def events_of(conn: HTTPConnection) -> ProjectEvents | None:
    """The app's event hub, or None when the events component is not loaded (nothing listens then)."""
    return getattr(conn.app.state, "project_events", None)


EventsDep = Annotated[ProjectEvents | None, Depends(events_of)]


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
    hub: ProjectEvents = websocket.app.state.project_events
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


def _setup(app: FastAPI) -> None:
    app.state.project_events = ProjectEvents()


@asynccontextmanager
async def events_lifespan(app: FastAPI) -> AsyncIterator[None]:
    app.state.project_events.start(asyncio.get_running_loop())
    yield


component = Component(name="events", router=router, setup=_setup, lifespan=events_lifespan)
