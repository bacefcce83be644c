"""A runner node: takes runs off the Redis runs stream and executes them on its own sandbox backend.

Each runner reads the stream in the `runners` consumer group only while it has a free slot, so work
goes to whoever has room. It acknowledges an entry in the same transaction that announces the run as
started; an entry read but never started (the runner died in between) stays pending, and a live runner
claims it once its reader's heartbeat has expired. The heartbeat (every HEARTBEAT_S) carries capacity:
CPUs, memory, slots and busy slots. On SIGTERM a runner drains: it says so in its heartbeat, takes no
new run, lets the running ones end (up to `drain_seconds`, then cancels them) and removes its heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError
from redis.typing import EncodableT, FieldT

from sandbox.backend import Backend, RunSpec, SandboxRun
from sandbox.backends.dispatch import (
    GROUP,
    HEARTBEAT_S,
    HEARTBEAT_TTL_MS,
    RUN_KEYS_TTL_S,
    RUNS_STREAM,
    Entry,
    Fields,
    decode_spec,
    encode_result,
    heartbeat_key,
    in_key,
    out_key,
    patiently,
    stream_entries,
)
from sandbox.hosted import remove_stale_cgroups
from sandbox.packages.proxy import INDEX_HOSTS, behind_index_proxy
from sandbox.runner_apps import AppHost
from sandbox.runner_cgroups import remove_orphaned_sibling_cgroups
from sandbox.verdict import RunResult, Verdict

if TYPE_CHECKING:
    from ide_server.settings import Settings

log = logging.getLogger(__name__)
CLAIM_IDLE_MS = 2 * HEARTBEAT_TTL_MS  # a pending entry this old whose reader has no heartbeat is taken over


def memory_bytes() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


class Runner:
    """One runner node's loop over the runs stream."""

    def __init__(self, redis: aioredis.Redis, backend: Backend, roots: tuple[Path, ...], *, slots: int = 4,
                 name: str | None = None, cpus: float | None = None, apps_host: str | None = None) -> None:
        """roots: the folders shared with the replicas (data, packages); a spec naming paths outside them is refused.
        apps_host: host deployed apps too, behind relays on this address (None: runs only)."""
        self.redis, self.backend, self.roots = redis, backend, tuple(root.resolve() for root in roots)
        self.slots, self.name = slots, name or f"{socket.gethostname()}-{os.getpid()}"
        # This process among those that carry the name: a runner restarted under it does not keep its runs alive
        self.incarnation = secrets.token_hex(8)
        self.cpus = cpus or len(os.sched_getaffinity(0))
        self.running: dict[str, asyncio.Task[None]] = {}
        self.draining = False
        self._free = asyncio.Semaphore(slots)
        self._left = asyncio.Event()  # drained: the heartbeat stops
        self._drain = asyncio.Event()
        self._next_orphan_check = 0.0
        self.apps = (AppHost(redis, backend, self.roots, runner=self.name, incarnation=self.incarnation, host=apps_host)
                     if apps_host else None)

    async def serve(self, stop: asyncio.Event, drain_seconds: float = 600) -> None:
        """Take and run work until `stop` is set, then drain and leave.

        Loops end on `draining` rather than by cancelling them: redis-py may swallow a cancel that
        lands in a blocking read, and every read here blocks for at most a second."""
        await self._ensure_group()
        for kind in ("run", "app") if self.apps is not None else ("run",):
            if stale := await asyncio.to_thread(remove_stale_cgroups, kind):
                log.warning("runner %s: removed %d cgroups of %ss a previous runner left", self.name, len(stale), kind)
        await asyncio.to_thread(remove_orphaned_sibling_cgroups)  # left by runners in other cgroups (a recreated container)
        await self._beat()
        beating = asyncio.create_task(self._heartbeat())
        taking = asyncio.create_task(self._take_work())
        hosting = asyncio.create_task(self.apps.serve(self._drain)) if self.apps else None
        log.info("runner %s ready: %d slots, %g CPUs%s", self.name, self.slots, self.cpus,
                 f", apps on {self.apps.host}" if self.apps else "")
        await stop.wait()
        self.draining = True
        self._drain.set()
        await self._beat()
        await taking
        if hosting is not None:
            await hosting
        log.info("runner %s draining %d runs", self.name, len(self.running))
        if self.running:
            _, late = await asyncio.wait(set(self.running.values()), timeout=drain_seconds)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self.apps is not None:  # their replicas see them end and start them again on another runner
            await self.apps.stop_all()
        self._left.set()
        await beating
        await self.redis.delete(heartbeat_key(self.name))
        with suppress(ResponseError):
            await self.redis.xgroup_delconsumer(RUNS_STREAM, GROUP, self.name)

    async def _ensure_group(self) -> None:
        with suppress(ResponseError):  # BUSYGROUP: another runner made it first
            await self.redis.xgroup_create(RUNS_STREAM, GROUP, id="0", mkstream=True)

    async def _beat(self) -> None:
        key = heartbeat_key(self.name)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"incarnation": self.incarnation, "cpus": self.cpus, "memory_bytes": memory_bytes(), "slots": self.slots,
                                    "busy": len(self.running), "draining": int(self.draining), "at": time.time(),
                                    **(self.apps.load() if self.apps else {})})
            pipe.pexpire(key, HEARTBEAT_TTL_MS)
            await pipe.execute()

    async def _heartbeat(self) -> None:
        while not self._left.is_set():
            with suppress(TimeoutError):
                await asyncio.wait_for(self._left.wait(), HEARTBEAT_S)
            try:
                await self._beat()
                if self.apps is not None:
                    await self.apps.stop_orphans()
            except Exception:
                log.exception("runner %s: heartbeat failed", self.name)

    async def _take_work(self) -> None:
        """With a free slot, take the next run: one left by a dead runner first, else a new one."""
        while not self.draining:
            await self._free.acquire()
            if self.draining:
                self._free.release()
                return
            try:
                entry = await self._claim_orphan() if self._orphans_due() else None
                entry = entry or await self._read_new()
            except Exception as exc:
                self._free.release()
                log.warning("runner %s: reading the runs stream failed: %s", self.name, exc)
                await asyncio.sleep(1)
                with suppress(Exception):  # a Redis restarted without its data has lost the group
                    await self._ensure_group()
                continue
            if entry is None:
                self._free.release()
                continue
            entry_id, fields = entry
            if not {b"id", b"spec", b"deadline"} <= fields.keys():
                log.warning("runner %s: dropping malformed run entry %s", self.name, entry_id.decode())
                await self._done_with(entry_id)
                self._free.release()
                continue
            run_id = fields[b"id"].decode()
            self.running[run_id] = asyncio.create_task(self._execute(entry_id, run_id, fields))

    async def _done_with(self, entry_id: bytes) -> None:
        """Acknowledge an entry and delete it (the stream keeps only runs not yet started)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xack(RUNS_STREAM, GROUP, entry_id)
            pipe.xdel(RUNS_STREAM, entry_id)
            await pipe.execute()

    async def _read_new(self) -> Entry | None:
        entries = stream_entries(await self.redis.xreadgroup(GROUP, self.name, {RUNS_STREAM: ">"}, count=1, block=1000))
        return entries[0] if entries else None

    def _orphans_due(self) -> bool:
        """Whether to look for orphaned entries before this read: at most once a heartbeat (an orphan waits
        CLAIM_IDLE_MS anyway), not before every run, which cost a round trip to Redis per run."""
        now = time.monotonic()
        if now < self._next_orphan_check:
            return False
        self._next_orphan_check = now + HEARTBEAT_S
        return True

    async def _claim_orphan(self) -> Entry | None:
        """A run another runner read but never started, once that runner's heartbeat is gone; or one read under this
        name by an earlier process (this one starts what it reads at once, so its own entries are never this idle)."""
        pending = cast(list[dict[str, Any]],  # {"message_id": bytes, "consumer": bytes, ...} each
                       await self.redis.xpending_range(RUNS_STREAM, GROUP, min="-", max="+", count=20, idle=CLAIM_IDLE_MS))
        for item in pending:
            owner = item["consumer"].decode()
            if owner != self.name and await self.redis.exists(heartbeat_key(owner)):
                continue
            claimed = cast(list[tuple[bytes, Fields | None]],  # RESP2; no fields: the entry was deleted
                           await self.redis.xclaim(RUNS_STREAM, GROUP, self.name, CLAIM_IDLE_MS, [item["message_id"]]))
            if claimed and (fields := claimed[0][1]):
                log.warning("runner %s: taking over run entry %s that %s read but never started",
                            self.name, item["message_id"].decode(), owner)
                return claimed[0][0], fields
        return None

    async def _execute(self, entry_id: bytes, run_id: str, fields: Fields) -> None:
        try:
            await self._run_entry(entry_id, run_id, fields)
        except Exception:
            log.exception("runner %s: run %s failed", self.name, run_id)
        finally:
            del self.running[run_id]
            self._free.release()

    async def _run_entry(self, entry_id: bytes, run_id: str, fields: Fields) -> None:
        out = out_key(run_id)
        if time.time() > float(fields[b"deadline"]):
            await self._done_with(entry_id)  # its replica has given up on it
            return
        async with self.redis.pipeline(transaction=True) as pipe:  # started and acknowledged at once
            pipe.xrange(in_key(run_id), count=16)  # (told to cancel before it started? steering goes on after these)
            pipe.xadd(out, {"t": "started", "runner": self.name, "incarnation": self.incarnation})
            pipe.xack(RUNS_STREAM, GROUP, entry_id)
            pipe.xdel(RUNS_STREAM, entry_id)
            told = cast(list[Entry], (await pipe.execute())[0])
        if any(f.get(b"t") == b"cancel" for _, f in told):  # it is not run; a replica still following hears why
            await self._say(out, t="result", r=encode_result(RunResult(Verdict.CANCELLED, message="cancelled before it started")))
            return
        try:
            spec = self._checked(decode_spec(fields[b"spec"]))
        except (ValueError, KeyError, TypeError) as exc:
            await self._say(out, t="result", r=_internal_error(f"the run's description was refused: {exc}"))
            return
        async with AsyncExitStack() as stack:
            try:  # an install's way out to the index: a proxy on this machine
                here = await stack.enter_async_context(behind_index_proxy(spec))
            except OSError as exc:
                await self._say(out, t="result", r=_internal_error(f"runner {self.name} could not serve the index proxy: {exc}"))
                return
            await self._run(run_id, out, here, fields, told)

    async def _run(self, run_id: str, out: str, spec: RunSpec, fields: Fields, told: list[Entry]) -> None:
        """Start the run, give it what its entry and in stream said, and stream its output and result."""
        run = await self.backend.start(spec)
        loop = asyncio.get_running_loop()
        run.on_change = lambda: loop.create_task(self._say(out, t="wait", v=int(run.waiting_for_input)))
        run.on_files_copied = lambda: loop.create_task(self._files_copied(out, spec.project_dir))
        if b"stdin" in fields:  # the input its replica had when it queued the run came with it
            await run.send_stdin(fields[b"stdin"])
        if b"eof" in fields:
            await run.close_stdin()
        for _, told_fields in told:  # what its in stream said before the start
            await _steer_once(run_id, run, told_fields)
        ended = asyncio.Event()
        steering = asyncio.create_task(self._steer(run_id, run, ended, told[-1][0] if told else "0"))
        try:
            async for chunk in run.chunks():
                await self._say(out, t="out", s=chunk.stream, d=chunk.data)
        except asyncio.CancelledError:  # drained too long: the run is cancelled, its result still goes out
            run.cancel()
        except RedisError:  # Redis away for longer than REDIS_OUTAGE_S: nobody hears the run, so stop it
            run.cancel()
            await run.result()
            raise
        finally:
            ended.set()
        result = await run.result()
        await _handed_back(spec.project_dir)
        # The result, and "ended" on the in stream, which wakes the steering read now (not after its 1 s block): the slot frees
        await self._say(out, t="result", r=encode_result(result), also=(in_key(run_id), {"t": "ended"}))
        await steering

    async def _files_copied(self, out: str, project_dir: Path) -> None:
        await _handed_back(project_dir)
        await self._say(out, t="files")

    def _checked(self, spec: RunSpec) -> RunSpec:
        """Refuse a spec naming folders outside the shared folders, or a way out to anything but a package index."""
        for path in (spec.project_dir, *(m.source for m in spec.mounts)):
            if not any(Path(path).resolve().is_relative_to(root) for root in self.roots):
                raise ValueError(f"{path} is outside this runner's shared folders")
        if other := spec.index_hosts - INDEX_HOSTS:
            raise ValueError(f"{', '.join(sorted(other))} is not a package index this runner lets installs reach")
        return spec

    async def _steer(self, run_id: str, run: SandboxRun, ended: asyncio.Event, last: str | bytes) -> None:
        """Pass what the run's in stream says after entry `last` to the run, until it has ended."""
        while not ended.is_set():
            answer = await patiently(lambda: self.redis.xread({in_key(run_id): last}, count=256, block=1000))
            for entry_id, fields in stream_entries(answer):
                last = entry_id
                await _steer_once(run_id, run, fields)

    async def _say(self, out: str, also: tuple[str, dict[FieldT, EncodableT]] | None = None, **fields: EncodableT) -> None:
        """Add an entry to a run's stream (and `also` one to another stream, in the same round trip)."""
        entry: dict[FieldT, EncodableT] = {name: value for name, value in fields.items()}
        said = [(out, entry), *([also] if also else [])]

        async def say() -> None:
            async with self.redis.pipeline(transaction=False) as pipe:
                for stream, stream_entry in said:
                    pipe.xadd(stream, stream_entry)
                    pipe.expire(stream, RUN_KEYS_TTL_S)
                await pipe.execute()

        await patiently(say)



async def _steer_once(run_id: str, run: SandboxRun, fields: Fields) -> None:
    """Apply one entry of a run's in stream: input, end of input, a resize or cancel."""
    kind = fields.get(b"t", b"")
    try:
        if kind == b"stdin":
            await run.send_stdin(fields[b"d"])
        elif kind == b"eof":
            await run.close_stdin()
        elif kind == b"resize":
            await run.resize(int(fields[b"rows"]), int(fields[b"cols"]))
        elif kind == b"cancel":
            run.cancel()
    except (ValueError, OSError) as exc:
        log.info("run %s: %s ignored: %s", run_id, kind.decode(), exc)


async def live_runners(redis: aioredis.Redis) -> list[dict[str, str]]:
    """The runners whose heartbeat is live, with their capacity (name, cpus, memory_bytes, slots, busy, draining)."""
    found = []
    async for key in redis.scan_iter(match=heartbeat_key("*"), count=100):
        fields = cast(Fields, await redis.hgetall(key))
        beat = {k.decode(): v.decode() for k, v in fields.items()}
        if beat:
            found.append({"name": key.decode().removeprefix(heartbeat_key("")), **beat})
    return sorted(found, key=lambda beat: beat["name"])


async def start_own_runner(settings: Settings) -> Callable[[], Awaitable[None]] | None:
    """With settings.runner_slots, a runner in this process (the replica is a runner node too, through Redis
    like any other); returns what drains and stops it, or None."""
    from ide_server.leases import connect
    from sandbox.backends.choice import make_backend
    from sandbox.errors import SandboxUnavailable

    if not settings.runner_slots or settings.redis_url is None:  # (the runners backend has Redis)
        return None
    try:
        local = make_backend("auto")
    except SandboxUnavailable as exc:
        log.warning("this replica runs no code itself: %s", exc.detail)
        return None
    redis = connect(settings.redis_url, 2 * settings.runner_slots + 8)
    runner = Runner(redis, local, (settings.data_dir, settings.effective_packages_dir), slots=settings.runner_slots,
                    name=f"{socket.gethostname()}-{os.getpid()}-replica",
                    apps_host=settings.replica_host or own_address(settings.host))
    stop = asyncio.Event()
    serving = asyncio.create_task(runner.serve(stop, drain_seconds=30))

    async def stopped() -> None:
        stop.set()
        await serving
        await redis.aclose()

    return stopped


def own_address(listen_host: str) -> str:
    """Where the other machines reach this one: the listen address, or this host's own when listening on all."""
    return listen_host if listen_host not in ("0.0.0.0", "::", "") else socket.gethostbyname(socket.gethostname())


def hand_back(folder: Path) -> None:
    """Give what this process wrote under `folder` (a run's files, copied back) to the folder's owner.

    A runner runs as root (in its container) beside replicas that run as another uid (10001 in the app image)
    and must change and remove what runs wrote in their shared folders: a new folder in a project, a package
    install's downloads. Links are neither followed nor walked into."""
    owner, me = os.stat(folder), os.geteuid()
    if owner.st_uid == me:
        return
    for _, folders, files, dir_fd in os.fwalk(folder):
        for name in (*folders, *files):
            with suppress(FileNotFoundError):
                if os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_uid == me:
                    os.chown(name, owner.st_uid, owner.st_gid, dir_fd=dir_fd, follow_symlinks=False)


async def _handed_back(folder: Path) -> None:
    try:
        if os.stat(folder).st_uid != os.geteuid():  # (runner and replicas as one user: nothing to give, no thread hop)
            await asyncio.to_thread(hand_back, folder)
    except OSError as exc:  # the files are there all the same; only their owner is not the folder's
        log.warning("handing %s back to its owner failed: %s", folder, exc)


def _internal_error(message: str) -> str:
    return encode_result(RunResult(Verdict.INTERNAL_ERROR, message=message))
