"""Which replica runs the apps when several share one database and Redis: the holder of a lease.

Apps are processes on one machine, and their routes, supervisors and in-flight counts live in one
process, so exactly one replica (the owner) runs every deployment; the others forward deploy
calls and app traffic to it (deploy_service.proxy, deploy_service.edge) and follow logs from the
shared data dir. The lease expires LEASE_MS after its holder stops renewing it; then another
replica takes it and brings every deployment back (`DeployService.restore`), as after a restart.
A lone server (no Redis) owns the apps from the start.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass
from typing import Any

from redis.exceptions import RedisError

from ide_server import leases

log = logging.getLogger(__name__)

LEASE_KEY = "codeyard:deploys:owner"
LEASE_MS = 10_000
RENEW_SECONDS = 2.0


@dataclass(frozen=True)
class Replica:
    """How the other replicas reach one: its IDE port and its apps' port ("host:port"), if any."""

    id: str
    http: str
    apps: str | None


def this_replica(host: str, port: int, apps_port: int | None) -> Replica:
    """This replica as the others reach it: `host` is Settings.reachable_host."""
    return Replica(secrets.token_hex(6), f"{host}:{port}", f"{host}:{apps_port}" if apps_port else None)


class Ownership:
    def __init__(self, here: Replica, redis_url: str | None, can_own: bool = True) -> None:
        self.here, self.can_own = here, can_own  # (a replica with no sandbox backend never takes the apps)
        self.redis = leases.connect(redis_url) if redis_url else None
        self.owner: Replica | None = here if self.redis is None else None
        self._holder = json.dumps(asdict(here))

    @property
    def is_owner(self) -> bool:
        return self.owner == self.here

    async def keep(self, gained: Callable[[], Coroutine[Any, Any, object]], lost: Callable[[], Awaitable[object]]) -> None:
        """Forever: renew or try to take the lease, and learn who holds it. `gained` runs as its own task
        (bringing many apps back may outlast the lease, which keeps being renewed meanwhile)."""
        assert self.redis is not None
        tasks: set[asyncio.Task[object]] = set()
        while True:
            try:
                held = self.can_own and await leases.claim(self.redis, LEASE_KEY, self._holder, LEASE_MS)
                if held and not self.is_owner:
                    log.info("this replica runs the deployed apps now")
                    self.owner = self.here
                    task: asyncio.Task[object] = asyncio.create_task(gained())
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                elif not held:
                    if self.is_owner:
                        log.warning("another replica took over the deployed apps: stopping ours")
                        self.owner = None
                        await lost()
                    raw = await self.redis.get(LEASE_KEY)
                    self.owner = Replica(**json.loads(raw)) if raw else None
            except (RedisError, OSError) as exc:  # the owner keeps serving; nobody can take over meanwhile
                log.warning("deploys lease: Redis unreachable: %s", exc)
            await asyncio.sleep(RENEW_SECONDS)

    async def close(self) -> None:
        """Hand the lease over at once (a clean shutdown need not wait for it to expire)."""
        if self.redis is None:
            return
        try:
            if self.is_owner:
                await leases.release(self.redis, LEASE_KEY, self._holder)
        except (RedisError, OSError):
            pass
        await self.redis.aclose()
