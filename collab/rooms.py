"""The rooms of one server process: created once per file, unloaded when idle, shared via Redis.

A per-key asyncio lock makes the first clients that join at the same moment share one room and
one load from storage; unloading takes the same lock, so a joiner never sees a half-closed room.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from collab.fanout import Fanout
from collab.room import Room, RoomKey
from collab.store import UpdateStore

CLOSE_FORBIDDEN = 4403
CLOSE_GONE = 4404


class RoomManager:
    def __init__(
        self,
        store: UpdateStore,
        resolve_path: Callable[[RoomKey], Path],
        *,
        fanout: Fanout | None = None,
        idle_unload_s: float = 30.0,
        compact_every: int = 500,
        on_edit: Callable[[RoomKey, str], None] | None = None,
    ) -> None:
        self.store = store
        self.resolve_path = resolve_path
        self.fanout = fanout
        self.idle_unload_s = idle_unload_s
        self.compact_every = compact_every
        self.on_edit = on_edit
        self.rooms: dict[RoomKey, Room] = {}
        self._locks: dict[RoomKey, asyncio.Lock] = {}
        self._unloads: dict[RoomKey, asyncio.Task[None]] = {}
        if fanout:
            fanout.on_revoke = self._close_local_user

    async def acquire(self, key: RoomKey) -> Room:
        """The loaded room for key, creating it if needed; pair with release()."""
        async with self._lock(key):
            self._cancel_unload(key)
            room = self.rooms.get(key)
            if room is None or room.closed:
                room = await self._open(key)
            room.holders += 1
            return room

    async def release(self, room: Room) -> None:
        room.holders -= 1
        if room.holders == 0 and self.rooms.get(room.key) is room:
            self._cancel_unload(room.key)
            self._unloads[room.key] = asyncio.create_task(self._unload_later(room))

    @asynccontextmanager
    async def room(self, key: RoomKey) -> AsyncIterator[Room]:
        room = await self.acquire(key)
        try:
            yield room
        finally:
            await self.release(room)

    async def set_text(self, key: RoomKey, text: str) -> None:
        """Apply a change made outside the editor (files API, history restore) through the room."""
        async with self.room(key) as room:
            await room.set_text(text)
            await room.mirror.flush()

    def open_keys(self, project_id: str, path: str = "") -> list[RoomKey]:
        """Keys of the project's rooms open in this process, for path and everything under it."""
        return [
            key for key in self.rooms
            if key.project_id == project_id and (not path or key.file_path == path or key.file_path.startswith(path + "/"))
        ]

    async def file_changed(self, key: RoomKey) -> None:
        """The file was written outside the editor (files API): merge it now, not at the next poll.

        Merged against the text last written, so what clients typed meanwhile stays. Only the
        replica that owns the file merges; a file that is no longer text loses its room.
        """
        room = self.rooms.get(key)
        if room is None or room.closed or not room.mirror.owner:
            return
        try:
            await room.mirror.check_now()
        except ValueError:
            await self.forget(key)
        except FileNotFoundError:
            pass  # deleted meanwhile: the delete forgets the room

    async def flush_project(self, project_id: str) -> None:
        """Write every open file of a project to disk now (before a run, deploy or checkpoint),
        all at once: a run waits for this."""
        await asyncio.gather(*(room.mirror.flush() for key, room in list(self.rooms.items())
                               if key.project_id == project_id and room.mirror.owner))

    async def close_user(self, project_id: str, user_id: str, code: int = CLOSE_FORBIDDEN) -> None:
        """Close a user's sockets in a project on every replica (access revoked).

        Call it after the membership change is committed, so a reconnect is refused (4403).
        """
        await self._close_local_user(project_id, user_id, code)
        if self.fanout:
            await self.fanout.publish_revoke(project_id, user_id, code)

    async def _close_local_user(self, project_id: str, user_id: str, code: int) -> None:
        for key, room in list(self.rooms.items()):
            if key.project_id == project_id:
                for peer in [p for p in room.peers if p.user_id == user_id]:
                    await peer.close(code, "access revoked")

    async def forget(self, key: RoomKey) -> None:
        """The file was deleted: close its room and drop its stored document."""
        async with self._lock(key):
            self._cancel_unload(key)
            room = self.rooms.pop(key, None)
            if room is not None:
                for peer in list(room.peers):
                    await peer.close(CLOSE_GONE, "file deleted")
                await self._close(room, write_disk=False)
            await asyncio.to_thread(self.store.delete, key.name)

    async def shutdown(self) -> None:
        for key in list(self.rooms):
            async with self._lock(key):
                self._cancel_unload(key)
                room = self.rooms.pop(key, None)
                if room is not None:
                    await self._close(room)

    async def _open(self, key: RoomKey) -> Room:
        room = Room(
            key, self.resolve_path(key), self.store, self.fanout, compact_every=self.compact_every, on_edit=self.on_edit
        )
        if self.fanout:
            # Subscribe before loading so no update stored by another replica falls in between.
            await self.fanout.subscribe(room)
        try:
            await room.load()
        except BaseException:
            await room.unload(keep=False)
            if self.fanout:
                await self.fanout.unsubscribe(room)
            raise
        self.rooms[key] = room
        return room

    async def _close(self, room: Room, *, write_disk: bool = True) -> None:
        if self.fanout:
            await self.fanout.unsubscribe(room)
        await room.unload(keep=write_disk)

    async def _unload_later(self, room: Room) -> None:
        await asyncio.sleep(self.idle_unload_s)
        async with self._lock(room.key):
            if room.holders == 0 and self.rooms.get(room.key) is room:
                self._unloads.pop(room.key, None)
                await self._close(room)
                del self.rooms[room.key]

    def _cancel_unload(self, key: RoomKey) -> None:
        task = self._unloads.pop(key, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def _lock(self, key: RoomKey) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())
