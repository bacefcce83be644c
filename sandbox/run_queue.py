"""RunQueue: the queue every run of the app goes through (ProjectRuns, in service.py, is the app-facing service).

It owns a bounded queue (globally and per user, with a clear "queue full" answer), starts runs as
slots free up, keeps a record of each run (status, queue position, verdict, output) for
`GET /api/runs/{id}`, and lets any number of watchers (websockets) replay and follow a run's state
and output while it feeds stdin.

Slots are shared fairly: one user runs at most `max_running_per_user` at once (fewer than the
server's `max_running`), and a freed slot goes to the oldest waiting run of the user whose last turn
is the longest ago (users not yet served first). So a user who keeps resubmitting can hold neither
every slot nor the head of the queue: someone else's run starts within one slot's turnover.

A running interactive run that waits for input uses no CPU, so it lends its slot to the queue meanwhile
(at most `max_waiting` runs at once do), and takes one back when it goes on, past `max_running` for a
while if need be: a class of learners thinking at `input()` does not hold every slot for minutes.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Literal, Protocol

from sandbox.backend import OutputChunk, RunSpec, SandboxRun
from sandbox.errors import QueueFull, RunNotFound
from sandbox.verdict import RunResult, Verdict

Status = Literal["queued", "running", "finished"]
REMEMBERED_TURNS = 10_000  # users whose last turn is remembered; beyond, the idle ones longest ago are forgotten


class RunStarter(Protocol):
    """What runs start on: a Backend, or one that prepares a run's packages first (PackagesFirst)."""

    async def start(self, spec: RunSpec) -> SandboxRun: ...


@dataclass(frozen=True)
class RunState:
    """What watchers are told when it changes: the status, while queued the place in the queue (1: next), and
    while running whether the program waits for input (an interactive run's clock stands still then) and
    the port it serves HTTP on, with where its Webview opens it (each watcher's own address: sandbox.service fills it in)."""

    status: Status
    queue_position: int | None
    waiting_for_input: bool = False
    listening_port: int | None = None
    preview_url: str | None = None


@dataclass(eq=False)
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
    queue_position: int | None = None
    _admitted: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    _run: SandboxRun | None = None
    _pending_stdin: list[bytes | None] = field(default_factory=list)
    _cancelled: bool = False
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def waiting_for_input(self) -> bool:
        return self._run is not None and self._run.waiting_for_input

    @property
    def listening_port(self) -> int | None:
        return self._run.listening_port if self._run is not None else None

    def state(self) -> RunState:
        return RunState(self.status, self.queue_position, self.waiting_for_input, self.listening_port)

    def public(self) -> dict[str, Any]:
        result = self.result
        return {
            "id": self.id, "project_id": self.project_id, "status": self.status, "queue_position": self.queue_position,
            "waiting_for_input": self.waiting_for_input, "listening_port": self.listening_port,
            "argv": self.argv,
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


def too_many_runs(max_per_user: int) -> QueueFull:
    return QueueFull(f"you already have {max_per_user} runs waiting or running; wait for one to finish or cancel it")


class RunQueue:
    """Queue, start, record and stream runs on one backend."""

    def __init__(self, backend: RunStarter, *, max_running: int = 4, max_running_per_user: int = 2, max_queued: int = 64,
                 max_per_user: int = 8, keep_finished: int = 200, max_waiting: int | None = None) -> None:
        """max_running: runs at once, max_running_per_user of them one user's; max_per_user: runs one
        user may have waiting or running; max_queued: runs waiting beyond the running ones; max_waiting:
        running runs that wait for input without holding a slot (default 4 * max_running)."""
        self.backend = backend
        self.max_running, self.max_running_per_user, self.max_queued = max_running, max_running_per_user, max_queued
        self.max_per_user, self.keep_finished = max_per_user, keep_finished
        self._records: OrderedDict[str, RecordTask] = OrderedDict()
        self._waiting: dict[str, deque[RunRecord]] = {}  # user -> waiting runs, oldest first
        self._running: Counter[str] = Counter()  # user -> runs holding a slot
        self._turns: dict[str, int] = {}  # user -> number of their last turn (1, 2...), the longest ago first
        self._turns_given = 0
        self.max_waiting = 4 * max_running if max_waiting is None else max_waiting
        self._lent: set[str] = set()  # runs waiting for input that lent their slot

    def _active(self, user_id: str | None = None) -> list[RunRecord]:
        return [t.record for t in self._records.values()
                if t.record.status != "finished" and (user_id is None or t.record.user_id == user_id)]

    async def submit(self, user_id: str, project_id: str, spec: RunSpec) -> RunRecord:
        """Queue a run; raises QueueFull when the server or this user has too many waiting."""
        if len(self._active(user_id)) >= self.max_per_user:
            raise too_many_runs(self.max_per_user)
        if len(self._active()) >= self.max_running + self.max_queued:  # every slot busy and the queue full
            raise QueueFull(f"the run queue is full ({self.max_queued} runs waiting); try again in a few seconds")
        record = RunRecord(secrets.token_hex(8), user_id, project_id, list(spec.argv))
        self._waiting.setdefault(user_id, deque()).append(record)
        task = asyncio.create_task(self._execute(record, spec))
        self._records[record.id] = RecordTask(record, task)
        self._forget_old()
        self._dispatch()
        return record

    def get(self, run_id: str) -> RunRecord:
        try:
            return self._records[run_id].record
        except KeyError:
            raise RunNotFound(f"run {run_id} not found") from None

    async def updates(self, run_id: str) -> AsyncIterator[OutputChunk | RunState]:
        """The run's state whenever it changes (while queued or running) and all its output so far, then
        as it comes, until it finishes (many watchers at once)."""
        record = self.get(run_id)
        sent, told = 0, None
        while True:
            changed = record._changed
            state = record.state()
            if record.status != "finished" and state != told:
                told = state
                yield state
            while sent < len(record.output):
                yield record.output[sent]
                sent += 1
            if record.status == "finished":
                return
            await changed.wait()

    async def follow(self, run_id: str) -> AsyncIterator[OutputChunk]:
        """The run's output only (see updates)."""
        async for update in self.updates(run_id):
            if isinstance(update, OutputChunk):
                yield update

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
        if self._unqueue(record):
            record._admitted.set_result(False)
            self._reposition()
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
        admitted = False
        try:
            admitted = await record._admitted
            if not admitted or record._cancelled:
                record.result = RunResult(Verdict.CANCELLED, message="cancelled before it started")
            else:
                run = await self.backend.start(spec)
                record._run = run
                run.on_change = lambda: self._input_wait_changed(record)
                for data in record._pending_stdin:
                    await (run.close_stdin() if data is None else run.send_stdin(data))
                if record._cancelled:
                    run.cancel()
                async for chunk in run.chunks():
                    record.output.append(chunk)
                    record._notify()
                record.result = await run.result()
        finally:
            if record.id in self._lent:
                self._lent.discard(record.id)
            elif admitted:
                self._release(record.user_id)
            else:
                self._unqueue(record)
            record.status, record.finished_at, record._run = "finished", time.time(), None
            record._notify()
            self._dispatch()

    def _release(self, user: str) -> None:
        self._running[user] -= 1
        if not self._running[user]:
            del self._running[user]

    def _input_wait_changed(self, record: RunRecord) -> None:
        """Lend the slot of a run now waiting for input to the queue, or take one back as it goes on."""
        if record.waiting_for_input and record.id not in self._lent and len(self._lent) < self.max_waiting:
            self._lent.add(record.id)
            self._release(record.user_id)
            self._dispatch()
        elif not record.waiting_for_input and record.id in self._lent:
            self._lent.discard(record.id)
            self._running[record.user_id] += 1
        record._notify()

    def _dispatch(self) -> None:
        """Give free slots to waiting runs, each to the next user in turn who is under their own limit."""
        while self._running.total() < self.max_running:
            user = next((u for u in self._turn_order() if self._running[u] < self.max_running_per_user), None)
            if user is None:
                break
            record = self._waiting[user][0]
            self._unqueue(record)
            self._running[user] += 1
            self._turns_given += 1
            self._turns.pop(user, None)
            self._turns[user] = self._turns_given
            record.status, record.started_at, record.queue_position = "running", time.time(), None
            record._admitted.set_result(True)
            record._notify()
        self._forget_turns()
        self._reposition()

    def _turn_order(self) -> list[str]:
        """Users with waiting runs, whose turn comes first first: round-robin, users not yet served ahead."""
        return sorted(self._waiting, key=lambda user: self._turns.get(user, 0))  # stable: newcomers in order of arrival

    def _reposition(self) -> None:
        """Number the waiting runs in the order they would start (one per user per round), telling watchers of changes."""
        queues = [iter(self._waiting[user]) for user in self._turn_order()]
        position = 0
        while queues:
            still = []
            for queue in queues:
                if (record := next(queue, None)) is not None:
                    position += 1
                    if record.queue_position != position:
                        record.queue_position = position
                        record._notify()
                    still.append(queue)
            queues = still

    def _unqueue(self, record: RunRecord) -> bool:
        """Take a run out of its user's waiting queue; False where it was not waiting."""
        queue = self._waiting.get(record.user_id)
        if queue is None or record not in queue:
            return False
        queue.remove(record)
        if not queue:
            del self._waiting[record.user_id]
        return True

    def _forget_turns(self) -> None:
        """Bound the memory of turns: forget idle users served the longest ago (forgotten, a user comes first
        in turn again, where the longest ago served nearly are anyway)."""
        if (excess := len(self._turns) - REMEMBERED_TURNS) > 0:
            for user in [u for u in islice(self._turns, excess) if u not in self._waiting and u not in self._running]:
                del self._turns[user]

    def _forget_old(self) -> None:
        finished = [k for k, t in self._records.items() if t.record.status == "finished"]
        for run_id in finished[: max(0, len(finished) - self.keep_finished)]:
            del self._records[run_id]


@dataclass
class RecordTask:
    record: RunRecord
    task: asyncio.Task[None]
