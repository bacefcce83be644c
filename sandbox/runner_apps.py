"""A runner node's hosted apps: what the replicas tell it on its own apps stream (start an app, stop it).

Each app is a `HostedApp` on the runner's own backend, behind an `AppRelay` on the runner's address. The
runner says on the app's out stream where the relay listens (once the app's bridge has bound its socket),
the app's log lines, and its exit. An entry names the runner process (`incarnation`) it was meant for, so
a runner restarted under the same name never starts what its predecessor was asked: that replica has seen
its runner go and placed the app again. Apps whose replica's keep-alive expired are stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import suppress
from pathlib import Path
from typing import cast

import redis.asyncio as aioredis
from redis.typing import EncodableT, FieldT

from sandbox.app_relay import AppRelay
from sandbox.backend import Backend
from sandbox.backends.dispatch import (
    RUN_KEYS_TTL_S,
    Fields,
    app_out_key,
    apps_key,
    decode_hosted,
    holder_key,
    patiently,
    stream_entries,
)
from sandbox.hosted import HostedApp, HostedSpec, Stream

log = logging.getLogger(__name__)
READY_TIMEOUT_S = 60.0  # an app whose bridge has not bound its socket by then is stopped
ORPHAN_AFTER_S = 6.0  # an app whose replica's keep-alive is missing this long is stopped (replicas renew every 3 s)


class _App:
    """One hosted app and the task that follows it from start to exit."""

    def __init__(self, app_id: str, holder: str, spec: HostedSpec) -> None:
        self.id, self.holder, self.spec = app_id, holder, spec
        self.process: HostedApp | None = None
        self.task: asyncio.Task[None] | None = None


class AppHost:
    """The apps one runner hosts (its apps stream's reader)."""

    def __init__(self, redis: aioredis.Redis, backend: Backend, roots: tuple[Path, ...], *, runner: str,
                 incarnation: str, host: str) -> None:
        """host: the address the relays listen on, which the replicas connect to."""
        self.redis, self.backend, self.roots = redis, backend, roots
        self.runner, self.incarnation, self.host = runner, incarnation, host
        self.apps: dict[str, _App] = {}
        self._missing: dict[str, float] = {}  # holder -> since when its keep-alive is missing

    def load(self) -> dict[FieldT, EncodableT]:
        """What the heartbeat says of the apps here (the replicas place apps by it)."""
        return {"apps": len(self.apps), "apps_host": self.host,
                "app_cpus": sum(a.spec.cpus for a in self.apps.values()),
                "app_memory_bytes": sum(a.spec.limits.memory_bytes for a in self.apps.values())}

    async def serve(self, draining: asyncio.Event) -> None:
        """Follow the apps stream until `draining` is set (every read blocks at most a second)."""
        stream, last = apps_key(self.runner), b"0"
        while not draining.is_set():
            try:
                entries = stream_entries(await self.redis.xread({stream: last}, count=32, block=1000))
            except Exception as exc:
                log.warning("runner %s: reading its apps stream failed: %s", self.runner, exc)
                await asyncio.sleep(1)
                continue
            for entry_id, fields in entries:
                last = entry_id
                await self.redis.xdel(stream, entry_id)
                self._obey(fields)

    def _obey(self, fields: Fields) -> None:
        kind, app_id = fields.get(b"t"), fields.get(b"id", b"").decode()
        if kind == b"stop" and (app := self.apps.get(app_id)) is not None and app.task is not None:
            app.task.cancel()
        elif kind == b"start" and fields.get(b"incarnation", b"").decode() == self.incarnation and app_id not in self.apps:
            try:
                spec = self._checked(decode_hosted(fields[b"spec"]))
            except (ValueError, KeyError, TypeError) as exc:
                asyncio.get_running_loop().create_task(self._say(app_id, t="exit", message=f"refused: {exc}"))
                return
            app = self.apps[app_id] = _App(app_id, fields.get(b"holder", b"").decode(), spec)
            app.task = asyncio.create_task(self._host(app))

    def _checked(self, spec: HostedSpec) -> HostedSpec:
        for path in (spec.release_dir, *(m.source for m in spec.mounts)):
            if not any(Path(path).resolve().is_relative_to(root) for root in self.roots):
                raise ValueError(f"{path} is outside this runner's shared folders")
        return spec

    async def _host(self, app: _App) -> None:
        """Start the app, open its relay once its socket is there, report its exit; stop it when cancelled."""
        lines: asyncio.Queue[tuple[Stream, str] | None] = asyncio.Queue()
        telling = asyncio.create_task(self._tell_lines(app.id, lines))
        app.process = process = HostedApp(self.backend, app.spec, lambda stream, line: lines.put_nowait((stream, line)))
        relay: AppRelay | None = None
        ended: dict[str, EncodableT] = {"message": "stopped"}
        try:
            await process.start()
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not process.exited and not process.socket_ready():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"its socket did not appear within {READY_TIMEOUT_S:g} s")
                await asyncio.sleep(0.05)
            if not process.exited:
                relay = AppRelay(process.address)
                await relay.start(self.host)
                await self._say(app.id, t="listening", address=relay.address, token=relay.token)
            status = await process.wait_exit()
            ended = {"code": "" if status.exit_code is None else status.exit_code,
                     "signal": "" if status.signal is None else status.signal}
        except asyncio.CancelledError:
            pass  # told to stop (or the runner is leaving)
        except Exception as exc:  # could not start it here (no free uid, its socket replaced...)
            log.warning("runner %s: app %s: %s", self.runner, app.id, exc)
            ended = {"message": f"runner {self.runner} could not host it: {exc}"}
        finally:
            if relay is not None:
                relay.close()
            await process.stop()
            lines.put_nowait(None)
            await telling
            with suppress(Exception):
                await self._say(app.id, t="exit", **ended)
            del self.apps[app.id]

    async def _tell_lines(self, app_id: str, lines: asyncio.Queue[tuple[Stream, str] | None]) -> None:
        while (line := await lines.get()) is not None:
            with suppress(Exception):  # a lost log line never stops the app
                await self._say(app_id, t="log", s=line[0], d=line[1])

    async def _say(self, app_id: str, **fields: EncodableT) -> None:
        entry: dict[FieldT, EncodableT] = {name: value for name, value in fields.items()}

        async def say() -> None:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xadd(app_out_key(app_id), entry, maxlen=1000, approximate=True)
                pipe.expire(app_out_key(app_id), RUN_KEYS_TTL_S)
                await pipe.execute()

        await patiently(say)

    async def stop_orphans(self) -> None:
        """Stop the apps whose replica stopped renewing its keep-alive (called with each heartbeat). A key missing
        for less than ORPHAN_AFTER_S is given time: a Redis restarted without its data has lost every one of them,
        and their replicas set them again within a few seconds."""
        holders = {app.holder for app in self.apps.values()}
        now = time.monotonic()
        for holder in holders:
            if await self.redis.exists(holder_key(holder)):
                self._missing.pop(holder, None)
            elif now - self._missing.setdefault(holder, now) >= ORPHAN_AFTER_S:
                for app in [a for a in self.apps.values() if a.holder == holder and a.task is not None]:
                    log.warning("runner %s: stopping app %s: the replica that placed it is gone", self.runner, app.id)
                    cast(asyncio.Task[None], app.task).cancel()

    async def stop_all(self) -> None:
        tasks = [app.task for app in self.apps.values() if app.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
