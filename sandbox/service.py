"""RunService: the API layer's one entry point for running code.

It owns a bounded queue (globally and per user, with a clear "queue full" answer), starts runs as
slots free up, keeps a record of each run (status, verdict, output) for `GET /api/runs/{id}`, and
lets any number of watchers (websockets) replay and follow a run's output while it feeds stdin.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import AsyncIterator, Literal

from sandbox.backend import Backend, OutputChunk, RunSpec, SandboxRun
from sandbox.errors import QueueFull, RunNotFound
from sandbox.verdict import RunResult, Verdict

Status = Literal["queued", "running", "finished"]


@dataclass
class RunRecord:
    """What the API shows about one run."""

    id: str
    user_id: str
    project_id: str
    argv: list[str]
    status: Status = "queued"
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    result: RunResult | None = None
    output: list[OutputChunk] = field(default_factory=list)
    _run: SandboxRun | None = None
    _pending_stdin: list[bytes | None] = field(default_factory=list)
    _cancelled: bool = False
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def public(self) -> dict:
        result = self.result
        return {
            "id": self.id, "project_id": self.project_id, "status": self.status, "argv": self.argv,
            "created_at": self.created_at, "started_at": self.started_at, "finished_at": self.finished_at,
            "verdict": result.verdict.value if result else None,
            "exit_code": result.exit_code if result else None, "signal": result.signal if result else None,
            "cpu_seconds": result.cpu_seconds if result else None, "wall_seconds": result.wall_seconds if result else None,
            "peak_memory_bytes": result.peak_memory_bytes if result else None,
            "stdout": b"".join(c.data for c in self.output if c.stream == "stdout").decode("utf-8", "replace"),
            "stderr": b"".join(c.data for c in self.output if c.stream == "stderr").decode("utf-8", "replace"),
            "files_written": result.files_written if result else [], "message": result.message if result else "",
        }

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


class RunService:
    """Queue, start, record and stream runs on one backend."""

    def __init__(self, backend: Backend, *, max_running: int = 4, max_queued: int = 64, max_per_user: int = 4,
                 keep_finished: int = 200) -> None:
        self.backend = backend
        self.max_running, self.max_queued = max_running, max_queued
        self.max_per_user, self.keep_finished = max_per_user, keep_finished
        self._slots = asyncio.Semaphore(max_running)
        self._records: OrderedDict[str, RecordTask] = OrderedDict()

    def _active(self, user_id: str | None = None) -> list[RunRecord]:
        return [t.record for t in self._records.values()
                if t.record.status != "finished" and (user_id is None or t.record.user_id == user_id)]

    async def submit(self, user_id: str, project_id: str, spec: RunSpec) -> RunRecord:
        """Queue a run; raises QueueFull when the server or this user has too many waiting."""
        if len(self._active(user_id)) >= self.max_per_user:
            raise QueueFull(f"you already have {self.max_per_user} runs waiting or running; wait for one to finish or cancel it")
        if len(self._active()) >= self.max_running + self.max_queued:  # every slot busy and the queue full
            raise QueueFull(f"the run queue is full ({self.max_queued} runs waiting); try again in a few seconds")
        record = RunRecord(secrets.token_hex(8), user_id, project_id, list(spec.argv))
        task = asyncio.create_task(self._execute(record, spec))
        self._records[record.id] = RecordTask(record, task)
        self._forget_old()
        return record

    def get(self, run_id: str) -> RunRecord:
        try:
            return self._records[run_id].record
        except KeyError:
            raise RunNotFound(f"run {run_id} not found") from None

    async def follow(self, run_id: str) -> AsyncIterator[OutputChunk]:
        """All output so far, then new output as it comes, until the run finishes (many watchers at once)."""
        record = self.get(run_id)
        sent = 0
        while True:
            changed = record._changed
            while sent < len(record.output):
                yield record.output[sent]
                sent += 1
            if record.status == "finished":
                return
            await changed.wait()

    async def send_stdin(self, run_id: str, data: bytes) -> None:
        record = self.get(run_id)
        if record._run is None:
            record._pending_stdin.append(data)
        else:
            await record._run.send_stdin(data)

    async def close_stdin(self, run_id: str) -> None:
        record = self.get(run_id)
        if record._run is None:
            record._pending_stdin.append(None)
        else:
            await record._run.close_stdin()

    def cancel(self, run_id: str) -> RunRecord:
        record = self.get(run_id)
        record._cancelled = True
        if record._run is not None:
            record._run.cancel()
        record._notify()
        return record

    async def wait(self, run_id: str) -> RunRecord:
        await asyncio.shield(self._records[self.get(run_id).id].task)
        return self.get(run_id)

    async def shutdown(self) -> None:
        """Cancel every run and wait until all have ended and cleaned up."""
        for run_id in list(self._records):
            self.cancel(run_id)
        await asyncio.gather(*(t.task for t in self._records.values()), return_exceptions=True)

    async def _execute(self, record: RunRecord, spec: RunSpec) -> None:
        async with self._slots:
            if record._cancelled:
                record.result = RunResult(Verdict.CANCELLED, message="cancelled before it started")
            else:
                record.status, record.started_at = "running", time.time()
                record._notify()
                run = await self.backend.start(spec)
                record._run = run
                for data in record._pending_stdin:
                    await (run.close_stdin() if data is None else run.send_stdin(data))
                if record._cancelled:
                    run.cancel()
                async for chunk in run.chunks():
                    record.output.append(chunk)
                    record._notify()
                record.result = await run.result()
        record.status, record.finished_at, record._run = "finished", time.time(), None
        record._notify()

    def _forget_old(self) -> None:
        finished = [k for k, t in self._records.items() if t.record.status == "finished"]
        for run_id in finished[: max(0, len(finished) - self.keep_finished)]:
            del self._records[run_id]


@dataclass
class RecordTask:
    record: RunRecord
    task: asyncio.Task
