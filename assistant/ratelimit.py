"""Per-user token buckets: a burst of assistant calls is fine, a sustained flood gets 429.

One server keeps them in memory; servers sharing a class (`serve --workers`, replicas) keep them in Redis,
so a user's rate is one whichever process their requests land on (each process's own buckets let a user
through N times as fast).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

log = logging.getLogger(__name__)

# KEYS[1]: the user's bucket; ARGV: rate per second, burst, cost. Redis's clock, so every process agrees.
_TAKE = """
local now = redis.call('TIME')
now = tonumber(now[1]) + tonumber(now[2]) / 1000000
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local saved = redis.call('HMGET', KEYS[1], 'tokens', 'updated')
local tokens = math.min(burst, (tonumber(saved[1]) or burst) + (now - (tonumber(saved[2]) or now)) * rate)
local wait = 0
if tokens >= cost then tokens = tokens - cost else wait = math.max(1, math.ceil((cost - tokens) / rate)) end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'updated', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 60)
return wait
"""


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """`burst` calls at once, refilled at `per_minute` calls a minute, for each key (a user id).

    `take` answers 0 when the call may go ahead, else the seconds to wait before retrying.
    """

    def __init__(self, per_minute: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if per_minute <= 0:
            raise ValueError(f"per_minute: must be > 0, got {per_minute!r}")
        if burst < 1:
            raise ValueError(f"burst: must be >= 1, got {burst!r}")
        self.rate = per_minute / 60.0
        self.burst = burst
        self.clock = clock
        self._buckets: dict[object, _Bucket] = {}
        self._lock = threading.Lock()

    def take(self, key: object, cost: float = 1.0) -> int:
        now = self.clock()
        with self._lock:
            bucket = self._buckets.setdefault(key, _Bucket(float(self.burst), now))
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
            if bucket.tokens >= cost:
                bucket.tokens -= cost
                return 0
            return max(1, math.ceil((cost - bucket.tokens) / self.rate))


class SharedRateLimiter:
    """RateLimiter's buckets in Redis (one atomic script a call). If Redis does not answer, this process's
    own buckets decide meanwhile: the assistant stays up, as loose as N separate servers."""

    PREFIX = "codeyard:assistant:rate:"

    def __init__(self, client: redis.Redis, per_minute: float, burst: int) -> None:
        self.local = RateLimiter(per_minute, burst)  # (checks the arguments too)
        self.client = client
        self._take = client.register_script(_TAKE)

    def take(self, key: object, cost: float = 1.0) -> int:
        try:
            return int(self._take(keys=[f"{self.PREFIX}{key}"], args=[self.local.rate, self.local.burst, cost]))
        except redis.RedisError as exc:
            log.warning("assistant rate limits from this process only: Redis did not answer (%s)", exc)
            return self.local.take(key, cost)
