"""Hosted apps on runner nodes, as the replica that runs the apps places and follows them (sandbox.runner_apps
is the runner's side).

`RunnerHosting.host` picks, among live runners that host apps and are not draining, the one with the most
free CPU (its heartbeat's CPUs less what it hosts: its own count, or this replica's, whichever is larger;
this replica's own count covers what it placed since the runner's last heartbeat) that has the memory left.
A `RunnerApp` then tells that runner to start the app and follows the app's out stream: where its relay
listens, its log lines, its exit. When the runner stops heartbeating (or another process took its name),
the app counts as exited, with a message saying so: the supervisor starts it again, on another runner.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from contextlib import suppress
from typing import cast

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from redis.typing import EncodableT, FieldT

from sandbox.backend import ExitStatus
from sandbox.backends.dispatch import (
    HEARTBEAT_TTL_MS,
    app_out_key,
    apps_key,
    encode_hosted,
    heartbeat_key,
    holder_key,
    patiently,
    stream_entries,
)
from sandbox.errors import SandboxUnavailable
from sandbox.hosted import ExitFollowed, Hosted, HostedSpec, Stream

log = logging.getLogger(__name__)
HOLDER_TTL_MS = 3 * HEARTBEAT_TTL_MS  # runners stop this replica's apps this long (and ORPHAN_AFTER_S) after it stopped renewing
STOP_WAIT_S = 15.0  # how long a stop waits for the runner to say the app ended


class RunnerApp(ExitFollowed):
    """One app on one runner node, followed through its out stream (a `Hosted`)."""

    def __init__(self, hosting: RunnerHosting, spec: HostedSpec, sink: Callable[[Stream, str], None]) -> None:
        self.hosting, self.spec, self.sink = hosting, spec, sink
        self.id = secrets.token_hex(8)
        self.runner: str | None = None
        self.incarnation = b""
        self.address = ""  # the relay's "host:port", once the runner has said it
        self.preamble = b""  # the relay's token
        self.lost: str | None = None
        self._following: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.runner, self.incarnation = await self.hosting.choose(self.spec)
        self.hosting.placed.add(self)
        self._exit = asyncio.get_running_loop().create_future()
        self._following = asyncio.create_task(self._follow())
        await self.hosting.tell(self.runner, t="start", id=self.id, spec=encode_hosted(self.spec),
                                incarnation=self.incarnation, holder=self.hosting.holder)

    def socket_ready(self) -> bool:
        """Whether the runner has said where the app's relay listens (it seals the socket before)."""
        return bool(self.address)

    async def _follow(self) -> None:
        """Apply the app's out stream until its exit, or until its runner is gone."""
        assert self._exit is not None and self.runner is not None
        last: bytes | str = "0"
        try:
            while not self._exit.done():
                reply = await patiently(lambda: self.hosting.redis.xread({app_out_key(self.id): last}, count=256, block=1000))
                entries = stream_entries(reply)
                for entry_id, fields in entries:
                    last = entry_id
                    self._take(fields)
                if not entries and not self._exit.done() and await self._runner_gone():
                    self.lost = f"runner {self.runner} stopped hosting it (its process or machine went away)"
                    self._exit.set_result(ExitStatus())
        except (RedisError, OSError) as exc:
            if not self._exit.done():
                self.lost = f"lost touch with runner {self.runner}: {exc}"
                self._exit.set_result(ExitStatus())
        finally:
            self.hosting.placed.discard(self)

    def _take(self, fields: dict[bytes, bytes]) -> None:
        assert self._exit is not None
        kind = fields.get(b"t")
        if kind == b"log":
            self.sink(cast(Stream, fields[b"s"].decode()), fields[b"d"].decode("utf-8", "replace"))
        elif kind == b"listening":
            self.preamble, self.address = fields[b"token"], fields[b"address"].decode()
        elif kind == b"exit" and not self._exit.done():
            code, signal = fields.get(b"code", b""), fields.get(b"signal", b"")
            if message := fields.get(b"message", b"").decode():
                self.lost = message
            self._exit.set_result(ExitStatus(int(code) if code else None, int(signal) if signal else None))

    async def _runner_gone(self) -> bool:
        assert self.runner is not None
        runner = self.runner
        beating = await patiently(lambda: self.hosting.redis.hget(heartbeat_key(runner), "incarnation"))
        return beating != self.incarnation

    async def stop(self) -> None:
        """Tell its runner to stop it and wait (a while) until it says so (idempotent)."""
        if self._following is None or self.runner is None:
            return
        if not self.exited:
            with suppress(RedisError, OSError):
                await self.hosting.tell(self.runner, t="stop", id=self.id)
            with suppress(TimeoutError):
                await asyncio.wait_for(self.wait_exit(), STOP_WAIT_S)
        self._following.cancel()
        await asyncio.gather(self._following, return_exceptions=True)


class RunnerHosting:
    """Places hosted apps on runner nodes (a `Hosting`), and keeps this replica's keep-alive for them."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self.holder = secrets.token_hex(8)
        self.placed: set[RunnerApp] = set()  # this replica's apps on runners, until they end
        self._keeping: asyncio.Task[None] | None = None

    def host(self, spec: HostedSpec, sink: Callable[[Stream, str], None]) -> Hosted:
        return RunnerApp(self, spec, sink)

    async def choose(self, spec: HostedSpec) -> tuple[str, bytes]:
        """The runner (name, incarnation) with the most free CPU that has the app's memory left."""
        if self._keeping is None:
            await self._renew()
            self._keeping = asyncio.create_task(self._keep())
        beats = {}
        async for key in self.redis.scan_iter(match=heartbeat_key("*"), count=100):
            beats[key.decode().removeprefix(heartbeat_key(""))] = cast(dict[bytes, bytes], await self.redis.hgetall(key))
        best: tuple[float, str, bytes] | None = None
        for name, beat in beats.items():
            if not beat or b"apps_host" not in beat or beat.get(b"draining") == b"1":
                continue
            mine = [a for a in self.placed if a.runner == name and a.incarnation == beat[b"incarnation"]]
            cpus = max(float(beat.get(b"app_cpus", 0)), sum(a.spec.cpus for a in mine))
            memory = max(int(beat.get(b"app_memory_bytes", 0)), sum(a.spec.limits.memory_bytes for a in mine))
            free = float(beat[b"cpus"]) - cpus
            if int(beat[b"memory_bytes"]) - memory >= spec.limits.memory_bytes and (best is None or free > best[0]):
                best = (free, name, beat[b"incarnation"])
        if best is None:
            raise SandboxUnavailable(f"no runner node can host the app now ({len(beats)} live; each needs "
                                     f"{spec.limits.memory_bytes >> 20} MiB free and to host apps)")
        return best[1], best[2]

    async def tell(self, runner: str, **fields: EncodableT) -> None:
        entry: dict[FieldT, EncodableT] = {name: value for name, value in fields.items()}
        await patiently(lambda: self.redis.xadd(apps_key(runner), entry, maxlen=1000, approximate=True))

    async def _renew(self) -> None:
        await self.redis.set(holder_key(self.holder), 1, px=HOLDER_TTL_MS)

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(HOLDER_TTL_MS / 4000)
            try:
                await self._renew()
            except RedisError as exc:
                log.warning("renewing the apps' keep-alive failed: %s", exc)

    async def close(self) -> None:
        """Stop renewing (the apps still placed stop on their runners once the keep-alive expires)."""
        if self._keeping is not None:
            self._keeping.cancel()
            await asyncio.gather(self._keeping, return_exceptions=True)
            self._keeping = None
        with suppress(RedisError, OSError):
            await self.redis.delete(holder_key(self.holder))
