"""Which servers are alive, so that a server closes only the unfinished runs of dead ones.

Each run's record names the server that follows it (`RunRow.server_id`). A server alone (no Redis)
is the only one there is: at start, every unfinished run belongs to a server that stopped. Replicas
share Redis and each keeps a heartbeat key there; every `SWEEP_S` a replica closes the runs of the
servers whose key was gone in two sweeps in a row (one is not enough: a Redis restart empties every
key until the next heartbeat). Before, every starting replica closed all unfinished runs, its
live peers' included, and a replica that crashed for good left its runs "running" for ever.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from contextlib import suppress

from redis.exceptions import RedisError

from ide_server.leases import connect

log = logging.getLogger(__name__)

KEY_PREFIX = "codeyard:server:"
BEAT_S = 3.0
TTL_S = 10.0
SWEEP_S = 15.0


def new_server_id() -> str:
    return secrets.token_hex(8)


class AloneOnHost:
    """One server and no Redis: no other server can be alive."""

    shared = False

    def __init__(self) -> None:
        self.server_id = new_server_id()

    async def start(self) -> None:
        return None

    async def alive(self, server_ids: set[str]) -> set[str]:
        return server_ids & {self.server_id}

    async def close(self) -> None:
        return None


class SharedPresence:
    """Replicas sharing Redis: a heartbeat key per server, which expires TTL_S after its server dies.
    Its value is where the server answers ("host:port"), so a run's socket opened on another replica
    is served by the one that runs it (sandbox.run_relay)."""

    shared = True

    def __init__(self, redis_url: str, address: str = "", *, beat_s: float = BEAT_S, ttl_s: float = TTL_S) -> None:
        self.server_id = new_server_id()
        self.address = address
        self.redis = connect(redis_url, max_connections=2)
        self.beat_s, self.ttl_s = beat_s, ttl_s
        self._beating: asyncio.Task[None] | None = None

    async def start(self) -> None:
        try:
            await self._beat()  # before any run is recorded under this id
        except (RedisError, OSError) as exc:
            log.warning("could not start this server's heartbeat (retrying): %s", exc)
        self._beating = asyncio.create_task(self._beat_forever(), name="server-heartbeat")

    async def alive(self, server_ids: set[str]) -> set[str]:
        ordered = sorted(server_ids)
        if not ordered:
            return set()
        found = await self.redis.mget([KEY_PREFIX + server_id for server_id in ordered])
        return {server_id for server_id, value in zip(ordered, found, strict=True) if value is not None}

    async def address_of(self, server_id: str) -> str | None:
        """Where a live server answers; None when it is gone or did not say."""
        value: bytes | str | None = await self.redis.get(KEY_PREFIX + server_id)
        if not value:
            return None
        return value.decode() if isinstance(value, bytes) else value

    async def close(self) -> None:
        if self._beating is not None:
            self._beating.cancel()
            await asyncio.gather(self._beating, return_exceptions=True)
        with suppress(RedisError, OSError):
            await self.redis.delete(KEY_PREFIX + self.server_id)
        await self.redis.aclose()

    async def _beat(self) -> None:
        await self.redis.set(KEY_PREFIX + self.server_id, self.address, px=int(self.ttl_s * 1000))

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(self.beat_s)
            try:
                await self._beat()
            except (RedisError, OSError) as exc:
                log.warning("could not renew this server's heartbeat: %s", exc)


ServerPresence = AloneOnHost | SharedPresence


def server_presence(redis_url: str | None, address: str = "") -> ServerPresence:
    return SharedPresence(redis_url, address) if redis_url else AloneOnHost()


class OrphanedRuns:
    """Closes the unfinished runs whose server is gone: once at start, then every SWEEP_S with replicas.

    unfinished_servers: the server ids of unfinished runs (None: a record from before runs named
    their server); close_runs_of: closes those servers' unfinished runs, returning how many. Both
    are called in a worker thread.
    """

    def __init__(self, presence: ServerPresence, unfinished_servers: Callable[[], set[str | None]],
                 close_runs_of: Callable[[set[str | None]], int], *, sweep_s: float = SWEEP_S,
                 confirm: bool | None = None) -> None:
        """confirm: a server must be missing at two sweeps in a row to count as dead (default: with replicas,
        which may beat late; not for `serve --workers` on its own Redis, which only its workers use and
        which is new at each start: a server missing there is gone, and its runs end at once)."""
        self.presence = presence
        self.confirm = presence.shared if confirm is None else confirm
        self.unfinished_servers, self.close_runs_of = unfinished_servers, close_runs_of
        self.sweep_s = sweep_s
        self._missing: set[str | None] = set()

    async def sweep(self) -> int:
        """Close the runs of servers that are dead; with replicas, missing now and at the last sweep."""
        servers = await asyncio.to_thread(self.unfinished_servers)
        alive = await self.presence.alive({server for server in servers if server is not None})
        missing = {server for server in servers if server not in alive}
        dead = missing & (self._missing | {None}) if self.confirm else missing
        self._missing = missing
        return await asyncio.to_thread(self.close_runs_of, dead) if dead else 0

    async def sweep_logged(self) -> None:
        """A sweep that logs what it closed, and a Redis that does not answer instead of raising."""
        try:
            closed = await self.sweep()
        except (RedisError, OSError) as exc:
            log.warning("could not check for runs of stopped servers: %s", exc)
            return
        if closed:
            log.warning("closed %d runs whose server stopped", closed)

    async def sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_s)
            await self.sweep_logged()
