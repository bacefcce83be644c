"""Redis leases: one replica at a time holds a key, and it expires when its holder dies.

Collab uses one per room (who writes the room's file); deploys one for the replica that runs the apps.
"""

from __future__ import annotations

import redis.asyncio as aioredis

# Connections a replica's client may hold; past that a caller waits up to REDIS_WAIT_S for one.
# (redis-py's default pool refuses the 101st at once: a class's 200 open rooms each claiming
# their file and publishing edits made collab fail with "Too many connections".)
REDIS_CONNECTIONS = 64
REDIS_WAIT_S = 10

# Renew our lease, or take it if nobody holds it. Returns 1 when we hold it afterwards.
CLAIM_SCRIPT = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 1
end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""
RELEASE_SCRIPT = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


def connect(url: str, max_connections: int = REDIS_CONNECTIONS) -> aioredis.Redis:
    """A client whose pool makes callers wait for a free connection instead of failing."""
    return aioredis.Redis(connection_pool=aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=REDIS_WAIT_S))


async def claim(redis: aioredis.Redis, key: str, holder: str | bytes, ttl_ms: int) -> bool:
    """Hold `key` as `holder` for ttl_ms more (renewed if ours, taken if free); False if another holds it."""
    held: int = await redis.eval(CLAIM_SCRIPT, 1, key, holder, ttl_ms)  # the script's 1 or 0
    return held == 1


async def release(redis: aioredis.Redis, key: str, holder: str | bytes) -> None:
    """Let go of `key` if `holder` still holds it."""
    await redis.eval(RELEASE_SCRIPT, 1, key, holder)
