"""Rooms shared by several app replicas: stored updates and presence travel over Redis pub/sub.

Each room has a channel; every message starts with the publishing replica's id so a replica
ignores its own echo. Updates are published only after they are stored, so a replica that
loads a room from the database and then hears the channel misses nothing (it subscribes first).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import redis.asyncio as aioredis

from collab.protocol import AwarenessEntry, decode_awareness_entries, encode_awareness_entries
from ide_server import leases

if TYPE_CHECKING:
    from collab.room import Room

log = logging.getLogger(__name__)

KIND_UPDATE = b"u"
KIND_AWARENESS = b"a"
KIND_QUERY_AWARENESS = b"q"  # "a replica just opened this room: tell it who is here"
KIND_REVOKE = b"r"  # close a user's sockets in a project, on every replica
CONTROL_CHANNEL = "codeyard:collab-control"
ORIGIN_BYTES = 8


DISK_LEASE_MS = 3000


def channel_name(room: str) -> str:
    return f"codeyard:collab:{room}"


def disk_lease_name(room: str) -> str:
    return f"codeyard:collab-disk:{room}"


class Fanout:
    def __init__(self, redis_url: str) -> None:
        self.redis = leases.connect(redis_url)
        self.origin = os.urandom(ORIGIN_BYTES)
        self._pubsub = self.redis.pubsub()
        self._rooms: dict[str, Room] = {}
        self._listener: asyncio.Task[None] | None = None
        self._starting = asyncio.Lock()
        # Set by the RoomManager: closes this replica's sockets of (project_id, user_id) with code.
        self.on_revoke: Callable[[str, str, int], Awaitable[None]] | None = None

    async def subscribe(self, room: Room) -> None:
        channel = channel_name(room.key.name)
        self._rooms[channel] = room
        async with self._starting:  # rooms open together: one listener (two would read one socket at once)
            if self._listener is None:
                await self._pubsub.subscribe(CONTROL_CHANNEL)
                self._listener = asyncio.create_task(self._listen(), name="collab-fanout")
        await self._pubsub.subscribe(channel)
        await self._publish(room.key.name, KIND_QUERY_AWARENESS, b"")

    async def unsubscribe(self, room: Room) -> None:
        channel = channel_name(room.key.name)
        if self._rooms.get(channel) is room:
            del self._rooms[channel]
            await self._pubsub.unsubscribe(channel)

    async def publish_update(self, room: str, update: bytes) -> None:
        await self._publish(room, KIND_UPDATE, update)

    async def publish_awareness(self, room: str, entries: list[AwarenessEntry]) -> None:
        await self._publish(room, KIND_AWARENESS, encode_awareness_entries(entries))

    async def publish_revoke(self, project_id: str, user_id: str, code: int) -> None:
        payload = json.dumps({"project_id": project_id, "user_id": user_id, "code": code}).encode()
        await self.redis.publish(CONTROL_CHANNEL, self.origin + KIND_REVOKE + payload)

    async def claim_disk(self, room: str) -> bool:
        """One replica at a time writes and watches a room's file; the lease expires if it dies."""
        return await leases.claim(self.redis, disk_lease_name(room), self.origin, DISK_LEASE_MS)

    async def release_disk(self, room: str) -> None:
        await leases.release(self.redis, disk_lease_name(room), self.origin)

    async def close(self) -> None:
        if self._listener:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
        await self._pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves PubSub.aclose unannotated
        await self.redis.aclose()

    async def _revoke(self, payload: bytes) -> None:
        try:
            order = json.loads(payload)
            if self.on_revoke:
                await self.on_revoke(str(order["project_id"]), str(order["user_id"]), int(order["code"]))
        except (ValueError, KeyError, TypeError):
            log.exception("ignoring a malformed revoke message")

    async def _publish(self, room: str, kind: bytes, payload: bytes) -> None:
        try:
            await self.redis.publish(channel_name(room), self.origin + kind + payload)
        except aioredis.RedisError:
            # Other replicas still converge: their clients resync from the database on reconnect.
            log.exception("publishing to Redis failed for room %s", room)

    async def _listen(self) -> None:
        while True:
            try:
                message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            except aioredis.RedisError:
                log.exception("Redis subscription failed; retrying")
                await asyncio.sleep(1.0)
                continue
            if message is None or message["type"] != "message":
                continue
            data: bytes = message["data"]
            if data[:ORIGIN_BYTES] == self.origin:
                continue
            if data[ORIGIN_BYTES : ORIGIN_BYTES + 1] == KIND_REVOKE:
                await self._revoke(data[ORIGIN_BYTES + 1 :])
                continue
            room = self._rooms.get(message["channel"].decode())
            if room is None:
                continue
            kind, payload = data[ORIGIN_BYTES : ORIGIN_BYTES + 1], data[ORIGIN_BYTES + 1 :]
            try:
                if kind == KIND_UPDATE:
                    room.receive_remote_update(payload)
                elif kind == KIND_AWARENESS:
                    room.receive_remote_awareness(list(decode_awareness_entries(payload)))
                elif kind == KIND_QUERY_AWARENESS:
                    local = room.local_presence()
                    if local:
                        await self.publish_awareness(room.key.name, local)
            except ValueError:
                log.exception("ignoring a malformed fan-out message for %s", room.key.name)
