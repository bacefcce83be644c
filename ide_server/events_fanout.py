"""Membership changes across app replicas (CODEYARD_REDIS_URL): the events hub's `access_changed`
travels over one Redis channel, so the sockets a removed member holds on any replica close (Webviews,
run and Shell sockets, collab rooms), not only those on the replica that took the request.

Each replica publishes the changes made through it and hands the others' to its own subscribers,
skipping its own echo. The channel is subscribed before the app serves, and a change is published
after it is committed, so a replica that reads the membership on hearing it sees the new one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable

import redis.asyncio as aioredis

from ide_server import leases

log = logging.getLogger(__name__)

CHANNEL = "codeyard:project-access"
CONNECTIONS = 4  # the subscription's own, and a few for publishing (changes are rare)


class AccessFanout:
    """Publishes this replica's membership changes and hears the other replicas' (given to `deliver`)."""

    def __init__(self, redis_url: str, deliver: Callable[[str, int], None]) -> None:
        self.redis = leases.connect(redis_url, CONNECTIONS)
        self.origin = secrets.token_hex(8)
        self.deliver = deliver
        self._pubsub = self.redis.pubsub()
        self._listener: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Subscribe before the app serves; if Redis does not answer yet, the listener keeps trying."""
        try:
            await self._pubsub.subscribe(CHANNEL)
        except aioredis.RedisError as exc:
            log.warning("Redis does not answer (%s): membership changes made on other replicas reach this "
                        "one's sockets once it does", exc)
        self._listener = asyncio.create_task(self._listen())

    async def publish(self, project_id: str, user_id: int) -> None:
        message = json.dumps({"origin": self.origin, "project_id": project_id, "user_id": user_id})
        try:
            await self.redis.publish(CHANNEL, message)
        except aioredis.RedisError:  # the other replicas' next request still checks the membership
            log.exception("telling the other replicas that access to project %s changed failed", project_id)

    async def _listen(self) -> None:
        while True:
            try:
                if not self._pubsub.subscribed:
                    await self._pubsub.subscribe(CHANNEL)
                message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            except aioredis.RedisError:
                log.exception("the Redis subscription for membership changes failed; retrying")
                await asyncio.sleep(1.0)
                continue
            if message is None or message["type"] != "message":
                continue
            try:
                change = json.loads(message["data"])
                if change["origin"] != self.origin:
                    self.deliver(str(change["project_id"]), int(change["user_id"]))
            except (ValueError, KeyError, TypeError):
                log.exception("ignoring a malformed membership change message")

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
        await self._pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        await self.redis.aclose()
