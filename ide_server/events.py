"""The project events hub: what the project events socket (`ide_server/api/events.py`) broadcasts.

Services publish here (files changed, a run started, a member's access changed) and in-process
parts subscribe (the collab rooms merge a file written through the API, and close the sockets of
a member who was removed); it lives outside the API modules so every package can import it. With
replicas, access changes also reach the other replicas' subscribers (events_fanout.py).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, WebSocket
from starlette.requests import HTTPConnection

from ide_server.wiring import services_of

# (project_id, action, path, to) and (project_id, user_id): the in-process subscribers' signatures.
FilesSubscriber = Callable[[str, str, str, str | None], Coroutine[Any, Any, None]]
AccessSubscriber = Callable[[str, int], Coroutine[Any, Any, None]]
Event = dict[str, Any]


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

    Built first by the composition root (`ide_server/wiring.py`), so the services built after it
    subscribe as they are built; events are delivered once `start` has given it the serving event loop.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listeners: dict[str, set[Listener]] = {}
        self._files_subscribers: list[FilesSubscriber] = []
        self._access_subscribers: list[AccessSubscriber] = []
        self._tasks: set[asyncio.Task[None]] = set()
        # With replicas (events_fanout): tells the other replicas of a membership change made here.
        self.publish_access: AccessSubscriber | None = None

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

    def announce(self, project_id: str, event: Event) -> None:
        """Send an event to the project's open workspaces only (runs: one started, one wrote files); the
        in-process subscribers are not told, as the collab rooms notice files written by runs on disk."""
        self._submit(lambda: [self._broadcast(project_id, event)])

    def access_changed(self, project_id: str, user_id: int) -> None:
        """A member was removed or their role changed (called after the change is committed): the subscribers
        here are told, and those of every other replica."""
        publish = self.publish_access
        self._submit(lambda: self._tell_access(project_id, user_id) + ([publish(project_id, user_id)] if publish else []))

    def access_changed_elsewhere(self, project_id: str, user_id: int) -> None:
        """Another replica's membership change (its fan-out calls this on the serving loop)."""
        self._spawn(lambda: self._tell_access(project_id, user_id))

    def _tell_access(self, project_id: str, user_id: int) -> list[Coroutine[Any, Any, None]]:
        return [subscriber(project_id, user_id) for subscriber in self._access_subscribers]

    def _submit(self, make: Callable[[], list[Coroutine[Any, Any, None]]]) -> None:
        if self._loop is not None and not self._loop.is_closed():  # else the app is not serving
            self._loop.call_soon_threadsafe(self._spawn, make)

    def _spawn(self, make: Callable[[], list[Coroutine[Any, Any, None]]]) -> None:
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

    async def _broadcast(self, project_id: str, event: Event) -> None:
        text = json.dumps(event)
        for listener in list(self._listeners.get(project_id, ())):
            try:
                await listener.websocket.send_text(text)
            except Exception:  # a socket closing meanwhile; its handler removes it
                pass


async def events_of(conn: HTTPConnection) -> ProjectEvents | None:
    """The app's event hub, or None when the events component is not loaded (nothing listens then)."""
    return services_of(conn.app.state).events


EventsDep = Annotated[ProjectEvents | None, Depends(events_of)]


