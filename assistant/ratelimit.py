"""Per-user token buckets: a burst of assistant calls is fine, a sustained flood gets 429."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


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
