"""The `runners` backend: runs go to runner nodes through Redis (sandbox.backends.dispatch) instead of starting here.

It is a Backend like bubblewrap and Docker, so RunQueue, package installs, the runs API, shells and
graders use it unchanged: its `_drive` queues the spec on the runs stream and replays what the runner
says (output, waiting for input, files copied, the result) into the run, whose input, resizes and cancel
go back through a RemoteExecution. A run no runner takes before its start deadline, or whose runner stops
heartbeating while it runs, ends as internal_error with a message saying so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from redis.typing import EncodableT, FieldT

from sandbox.backend import Backend, Execution, ExitStatus, RunContext, RunSpec, SandboxRun
from sandbox.backends.dispatch import (
    RUN_KEYS_TTL_S,
    RUNS_STREAM,
    decode_result,
    encode_spec,
    heartbeat_key,
    in_key,
    out_key,
    patiently,
)
from sandbox.verdict import RunResult, Verdict

log = logging.getLogger(__name__)
START_TIMEOUT_S = 60.0  # a run no runner has started by then fails (every runner gone or full for that long)
READ_BLOCK_MS = 1000  # how long one read of a run's output waits before checking its runner is alive


class RemoteExecution(Execution):
    """A run executing on a runner node, steered through its `in` stream (input, resize, cancel)."""

    def __init__(self, redis: aioredis.Redis, run_id: str) -> None:
        self.redis, self.run_id = redis, run_id
        self.runner: str | None = None  # the runner executing it, once one has started it
        self.incarnation: bytes | None = None  # which process under that name started it
        self._told: set[asyncio.Task[None]] = set()  # cancels under way (the loop keeps only weak references)

    async def write_stdin(self, data: bytes) -> None:
        await self._tell(t="stdin", d=data)

    async def close_stdin(self) -> None:
        await self._tell(t="eof")

    async def resize(self, rows: int, cols: int) -> None:
        await self._tell(t="resize", rows=rows, cols=cols)

    def kill(self) -> None:
        task = asyncio.get_running_loop().create_task(self._tell(t="cancel"))
        self._told.add(task)
        task.add_done_callback(self._told.discard)

    async def wait(self) -> ExitStatus:
        raise NotImplementedError("a remote run's end comes from its out stream (RemoteBackend._drive)")

    async def _tell(self, **fields: EncodableT) -> None:
        entry: dict[FieldT, EncodableT] = {name: value for name, value in fields.items()}
        async def tell() -> None:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xadd(in_key(self.run_id), entry)
                pipe.expire(in_key(self.run_id), RUN_KEYS_TTL_S)
                await pipe.execute()

        try:
            await patiently(tell)
        except RedisError as exc:
            log.warning("telling run %s %s failed: %s", self.run_id, fields.get("t"), exc)


def runner_of(run: SandboxRun) -> str | None:
    """The runner node executing a run of the runners backend (None until one has started it)."""
    return getattr(run._execution, "runner", None)


class RemoteBackend(Backend):
    """Runs on runner nodes: `_drive` queues the run on Redis and replays what its runner says into the run."""

    name = "runners"

    def __init__(self, redis: aioredis.Redis, start_timeout: float = START_TIMEOUT_S) -> None:
        self.redis, self.start_timeout = redis, start_timeout

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None  # runners come and go; a run that finds none fails with a message

    async def launch(self, ctx: RunContext) -> Execution:
        raise NotImplementedError("runs of the runners backend are launched on a runner node")

    async def _drive(self, run: SandboxRun, spec: RunSpec) -> RunResult:
        """The whole life of a run as its runner tells it; it ends with one result whatever happens."""
        began = time.monotonic()
        execution = RemoteExecution(self.redis, run.id)
        try:
            deadline = time.time() + self.start_timeout
            job: dict[FieldT, EncodableT] = {"id": run.id, "spec": encode_spec(spec), "deadline": repr(deadline),
                                             **_input_given(run)}
            await patiently(lambda: self.redis.xadd(RUNS_STREAM, job))
            await run._bind(execution)
            outcome = await self._follow(run, execution, deadline)
        except Exception as exc:
            log.exception("run %s on the runners failed", run.id)
            outcome = f"lost touch with the run: {exc}"
        finally:
            run._queue.put_nowait(None)
        if isinstance(outcome, RunResult):
            return outcome
        if execution.runner is None:  # nobody will start it now: a runner that reads it late drops it
            execution.kill()
        return run._result(Verdict.INTERNAL_ERROR, ExitStatus(), time.monotonic() - began, outcome)

    async def _follow(self, run: SandboxRun, execution: RemoteExecution, deadline: float) -> RunResult | str:
        """Replay the run's out stream until its result, or why it will never come."""
        last = "0"
        while True:
            answer = cast(list[Any], await patiently(  # RESP2: [[stream, [(id, fields), ...]]]
                lambda: self.redis.xread({out_key(run.id): last}, count=256, block=READ_BLOCK_MS)))
            entries = answer[0][1] if answer else []
            for entry_id, fields in entries:
                last = entry_id
                if (result := _take(run, execution, fields)) is not None:
                    return result
            if not entries and (gone := await self._gone(execution, deadline)):
                return gone

    async def _gone(self, execution: RemoteExecution, deadline: float) -> str | None:
        """Why the run will never end on its own (no runner took it; its runner died), or None."""
        if execution.runner is None:
            if time.time() < deadline:
                return None
            return f"no runner started the run within {self.start_timeout:g} s (are runner nodes up? `codeyard runner`)"
        runner = execution.runner
        beating = await patiently(lambda: self.redis.hget(heartbeat_key(runner), "incarnation"))
        if beating is not None and beating == execution.incarnation:
            return None
        return f"runner {execution.runner} stopped during the run (its process or machine went away); run it again"

    async def close(self) -> None:
        await self.redis.aclose()


def _input_given(run: SandboxRun) -> dict[FieldT, EncodableT]:
    """The input (and end of input) given before the run was queued, taken off the run to travel in its entry: a run
    given all its input at once (Backend.run: graders, installs, tests) costs no message on its in stream."""
    given, run._pending_stdin[:] = list(run._pending_stdin), []
    data = b"".join(chunk for chunk in given if chunk is not None)
    return {**({"stdin": data} if data else {}), **({"eof": 1} if None in given else {})}


def _take(run: SandboxRun, execution: RemoteExecution, fields: dict[bytes, bytes]) -> RunResult | None:
    """Apply one entry of the run's out stream; the result when it is the last."""
    kind = fields[b"t"]
    if kind == b"out":
        run.emit(fields[b"s"].decode(), fields[b"d"])  # type: ignore[arg-type]
    elif kind == b"started":
        execution.runner, execution.incarnation = fields[b"runner"].decode(), fields.get(b"incarnation")
    elif kind == b"wait":
        run.waiting_for_input = fields[b"v"] == b"1"
        run.on_change()
    elif kind == b"files":
        run.on_files_copied()
    elif kind == b"result":
        return decode_result(fields[b"r"], bytes(run._out["stdout"]), bytes(run._out["stderr"]))
    return None
