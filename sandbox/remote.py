"""The `runners` backend: runs go to runner nodes through Redis (sandbox.dispatch) instead of starting here.

It is a Backend like bubblewrap and Docker, so RunService, the runs API, shells and graders use it
unchanged: `start` queues the spec on the runs stream and returns a RemoteRun, which replays what the
runner says (output, waiting for input, files copied, the result) and passes input, resizes and cancel
back. A run no runner takes before its start deadline, or whose runner stops heartbeating while it
runs, ends as internal_error with a message saying so.
"""

from __future__ import annotations

import asyncio
import logging
import time

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from sandbox.backend import Backend, ExitStatus, Execution, OutputChunk, RunContext, RunSpec, SandboxRun
from sandbox.dispatch import (RUN_KEYS_TTL_S, RUNS_STREAM, decode_result, encode_spec, heartbeat_key, in_key,
                              out_key)
from sandbox.verdict import RunResult, Verdict

log = logging.getLogger(__name__)
START_TIMEOUT_S = 60.0  # a run no runner has started by then fails (every runner gone or full for that long)
READ_BLOCK_MS = 1000  # how long one read of a run's output waits before checking its runner is alive


class RemoteRun(SandboxRun):
    """A run executing on a runner node, seen through its Redis streams."""

    def __init__(self, redis: aioredis.Redis, spec: RunSpec, start_deadline: float) -> None:
        super().__init__(spec.limits, spec.tty)
        self.redis, self.start_deadline = redis, start_deadline
        self.runner: str | None = None  # the runner executing it, once one has started it
        self._began = time.monotonic()

    async def send_stdin(self, data: bytes) -> None:
        await self._tell(t="stdin", d=data)

    async def close_stdin(self) -> None:
        self.stdin_closed = True
        await self._tell(t="eof")

    async def resize(self, rows: int, cols: int) -> None:
        if not self.tty:
            raise ValueError("resize: this run has no terminal")
        if not (0 < rows <= 1000 and 0 < cols <= 1000):
            raise ValueError("resize: rows and cols must be between 1 and 1000")
        await self._tell(t="resize", rows=rows, cols=cols)

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            asyncio.get_running_loop().create_task(self._tell(t="cancel"))

    async def _tell(self, **fields) -> None:
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xadd(in_key(self.id), fields)
                pipe.expire(in_key(self.id), RUN_KEYS_TTL_S)
                await pipe.execute()
        except RedisError as exc:
            log.warning("telling run %s %s failed: %s", self.id, fields.get("t"), exc)

    async def follow(self) -> RunResult:
        """Replay the run's stream until its result (or until its runner is gone); the one result."""
        try:
            return await self._follow()
        except Exception as exc:
            log.exception("following run %s failed", self.id)
            return self._failed(f"lost touch with the run: {exc}")
        finally:
            self._queue.put_nowait(None)

    async def _follow(self) -> RunResult:
        last = "0"
        while True:
            answer = await self.redis.xread({out_key(self.id): last}, count=256, block=READ_BLOCK_MS)
            entries = answer[0][1] if answer else []
            for entry_id, fields in entries:
                last = entry_id
                if (result := self._take(fields)) is not None:
                    return result
            if not entries and (gone := await self._gone()):
                return self._failed(gone)

    def _take(self, fields: dict[bytes, bytes]) -> RunResult | None:
        """Apply one entry of the run's stream; the result when it is the last."""
        kind = fields[b"t"]
        if kind == b"out":
            stream = fields[b"s"].decode()
            self._out.setdefault(stream, bytearray()).extend(fields[b"d"])
            self._queue.put_nowait(OutputChunk(stream, fields[b"d"]))  # type: ignore[arg-type]
        elif kind == b"started":
            self.runner = fields[b"runner"].decode()
        elif kind == b"wait":
            self.waiting_for_input = fields[b"v"] == b"1"
            self.on_change()
        elif kind == b"files":
            self.on_files_copied()
        elif kind == b"result":
            return decode_result(fields[b"r"], bytes(self._out["stdout"]), bytes(self._out["stderr"]))
        return None

    async def _gone(self) -> str | None:
        """Why the run will never end on its own (no runner took it; its runner died), or None."""
        if self.runner is None:
            if time.time() < self.start_deadline:
                return None
            return (f"no runner started the run within {START_TIMEOUT_S:g} s (are runner nodes up? "
                    "`codeyard runner`)")
        if await self.redis.exists(heartbeat_key(self.runner)):
            return None
        return f"runner {self.runner} stopped during the run (its process or machine went away); run it again"

    def _failed(self, message: str) -> RunResult:
        if self.runner is None:  # nobody will start it now: tell a runner that reads it late to drop it
            asyncio.get_running_loop().create_task(self._tell(t="cancel"))
        return self._result(Verdict.INTERNAL_ERROR, ExitStatus(), time.monotonic() - self._began, message)


class RemoteBackend(Backend):
    """Runs on runner nodes: `start` queues the run on Redis; the shared lifecycle runs on the runner."""

    name = "runners"

    def __init__(self, redis: aioredis.Redis, start_timeout: float = START_TIMEOUT_S) -> None:
        self.redis, self.start_timeout = redis, start_timeout

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None  # runners come and go; a run that finds none fails with a message

    async def launch(self, ctx: RunContext) -> Execution:
        raise NotImplementedError("runs of the runners backend are launched on a runner node")

    async def start(self, spec: RunSpec) -> SandboxRun:
        deadline = time.time() + self.start_timeout
        run = RemoteRun(self.redis, spec, deadline)
        await self.redis.xadd(RUNS_STREAM, {"id": run.id, "spec": encode_spec(spec), "deadline": repr(deadline)})
        run._task = asyncio.create_task(run.follow())
        return run

    async def close(self) -> None:
        await self.redis.aclose()
