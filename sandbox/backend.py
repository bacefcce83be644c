"""The one interface every sandbox backend implements, and the run lifecycle they share.

A backend only knows how to launch a command in its isolation; `Backend.start` does the rest the
same way for all: a per-run uid, cgroup and quota'd workspace, copy in, the wall timer, output
accounting, the verdict, copy out, and cleanup that leaves no process, mount or folder behind.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import os
import re
import secrets
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from sandbox.cgroups import RunCgroup
from sandbox.files import Snapshot, WorkspaceTooLarge, copy_in, copy_out
from sandbox.limits import Limits
from sandbox.verdict import RunResult, Verdict
from sandbox.waiting import listening_ports, waiting_for_input
from sandbox.workspace import kill_uid, run_uid, scratch

log = logging.getLogger(__name__)

WORKSPACE = "/workspace"
MAX_ARGV_BYTES = 1 << 20
MAX_ARGV_ITEMS = 4096  # bubblewrap takes at most 9000 arguments, its own included
MAX_ARG_BYTES = 128 << 10  # the kernel's limit for one argument (MAX_ARG_STRLEN)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CPU_POLL_SECONDS = 0.1  # how often a run's total CPU time is read: what it may overrun by, at one CPU
IDLE_CPU_SHARE = 0.05  # a run using less of a CPU than this between two polls is idle (a blocked read uses none)
PREFERRED_PORT = 8080  # $PORT of interactive runs: the Webview shows it when the program listens on several
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class Mount:
    """A host folder the run sees at `target`: read-only, or writable for a package install's download cache
    (and, given to the run's uid, for the socket of a run's Webview bridge)."""

    source: Path
    target: str
    writable: bool = False
    owned_by_run: bool = False  # chowned to the run's uid before it starts (the uid is known only then)

    def __post_init__(self) -> None:
        if not self.target.startswith("/") or ".." in self.target.split("/") or self.target.rstrip("/") in ("", WORKSPACE):
            raise ValueError(f"mount target must be an absolute path other than / and {WORKSPACE}: {self.target!r}")
        if not Path(self.source).is_dir() or Path(self.source).is_symlink():
            raise ValueError(f"mount source is not a folder: {self.source}")


@dataclass(frozen=True)
class RunSpec:
    """What to run: an argument vector (never a shell string), over a copy of project_dir."""

    argv: Sequence[str]
    project_dir: Path
    limits: Limits = field(default_factory=Limits)
    env: Mapping[str, str] = field(default_factory=dict)
    terminal: tuple[int, int] | None = None  # (rows, cols): run on a terminal (a shell), one output stream
    mounts: tuple[Mount, ...] = ()  # extra host folders (a package env; an install's downloads)
    # Interactive (a run from the editor): time waiting for input does not count toward wall_seconds,
    # but one wait longer than this ends the run. None: the wall limit is strict (API and grader runs).
    input_wait_seconds: float | None = None
    # Copy what the program wrote back every this many seconds while it runs (the Shell), not only at the end.
    sync_seconds: float | None = None
    wrapper: tuple[str, ...] = ()  # a helper run in front of argv, which execs it (the Webview's bridge)
    # A package install's only way out: CONNECT tunnels to these index hosts, through a proxy that the machine the
    # run lands on sets up (sandbox.packages.proxy.behind_index_proxy; a runner node for the runners backend).
    index_hosts: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if isinstance(self.argv, (str, bytes)) or not self.argv:
            raise ValueError("argv must be a non-empty list of strings")
        if not all(isinstance(a, str) and "\0" not in a for a in self.argv):
            raise ValueError("argv items must be strings without NUL bytes")
        if len(self.argv) > MAX_ARGV_ITEMS:
            raise ValueError(f"argv has more than {MAX_ARGV_ITEMS} items")
        if max(len(a.encode()) for a in self.argv) > MAX_ARG_BYTES:
            raise ValueError(f"argv has an item longer than {MAX_ARG_BYTES} bytes")
        if sum(len(a.encode()) + 1 for a in self.argv) > MAX_ARGV_BYTES:
            raise ValueError(f"argv is longer than {MAX_ARGV_BYTES} bytes")
        for key, value in self.env.items():
            if not _ENV_NAME.match(key) or "\0" in value:
                raise ValueError(f"env has an invalid variable name or value: {key!r}")
        if self.terminal is not None and not (
            len(self.terminal) == 2 and all(isinstance(n, int) and 0 < n <= 1000 for n in self.terminal)
        ):
            raise ValueError("terminal must be (rows, cols), each between 1 and 1000")
        if not Path(self.project_dir).is_dir():
            raise ValueError(f"project_dir is not a folder: {self.project_dir}")
        for name in ("input_wait_seconds", "sync_seconds"):
            if (value := getattr(self, name)) is not None and not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a positive finite number")

    @property
    def command(self) -> list[str]:
        """What the backend starts: argv, behind the wrapper if there is one."""
        return [*self.wrapper, *self.argv]

    @property
    def tty(self) -> bool:
        return self.terminal is not None

    def environment(self) -> dict[str, str]:
        return {**BASE_ENV, **({"TERM": "xterm-256color"} if self.tty else {}), **self.env}


@dataclass(frozen=True)
class OutputChunk:
    stream: Literal["stdout", "stderr", "install"]  # install: package installs before the program starts
    data: bytes


@dataclass
class ExitStatus:
    exit_code: int | None = None
    signal: int | None = None
    cpu_seconds: float = 0.0
    peak_memory_bytes: int = 0
    oom_killed: bool = False


class Execution(abc.ABC):
    """A launched sandboxed process, as a backend controls it."""

    @abc.abstractmethod
    async def write_stdin(self, data: bytes) -> None: ...

    @abc.abstractmethod
    async def close_stdin(self) -> None: ...

    @abc.abstractmethod
    def kill(self) -> None:
        """Kill everything of the run now (idempotent, never blocks for long)."""

    async def resize(self, rows: int, cols: int) -> None:
        raise ValueError("resize: this run has no terminal")

    @abc.abstractmethod
    async def wait(self) -> ExitStatus:
        """Wait for the exit and for all output to be delivered."""

    async def cleanup(self) -> None:
        """Release backend resources (containers); called once, after wait or on failure."""

    def cgroup(self) -> RunCgroup | None:
        """Where the run's processes are counted when not in the run's own cgroup (a warm container's)."""
        return None


@dataclass
class RunContext:
    """What the shared lifecycle prepared for a backend's launch."""

    spec: RunSpec
    workspace: Path
    uid: int
    cgroup: RunCgroup | None
    run: SandboxRun


class SandboxRun:
    """A started run: stream its output, send it input, cancel it, await its one result."""

    def __init__(self, limits: Limits, tty: bool = False) -> None:
        self.id = secrets.token_hex(8)
        self.limits, self.tty = limits, tty
        self._queue: asyncio.Queue[OutputChunk | None] = asyncio.Queue()
        self._out = {"stdout": bytearray(), "stderr": bytearray()}
        self._total = 0
        self._execution: Execution | None = None
        self._pending_stdin: list[bytes | None] = []
        self._pending_size: tuple[int, int] | None = None
        self._task: asyncio.Task[RunResult] | None = None
        self.cancelled = False
        self.output_exceeded = False
        self.timed_out = False
        self.stdin_closed = False
        self.waiting_for_input = False  # an interactive run's program is blocked reading its input now
        self.listening_port: int | None = None  # an interactive run's program serves HTTP on this port (its Webview)
        self.on_change: Callable[[], object] = lambda: None  # called when waiting_for_input or listening_port changes
        self.limit_message = ""  # why a limit stopped it, where the verdict alone would not say
        self.on_files_copied: Callable[[], object] = lambda: None  # a sync (RunSpec.sync_seconds) copied files back

    def emit(self, stream: Literal["stdout", "stderr"], data: bytes) -> None:
        """Account for output: keep and stream it up to the limit, then stop the run."""
        if self.output_exceeded or not data:
            return
        room = self.limits.output_bytes - self._total
        if len(data) > room:
            data = data[: max(room, 0)]
            self.output_exceeded = True
        self._total += len(data)
        self._out[stream] += data
        if data:
            self._queue.put_nowait(OutputChunk(stream, bytes(data)))
        if self.output_exceeded:
            self._kill()

    async def chunks(self) -> AsyncIterator[OutputChunk]:
        """Output as it arrives, ending when the run has ended (one consumer)."""
        while (chunk := await self._queue.get()) is not None:
            yield chunk

    async def send_stdin(self, data: bytes) -> None:
        """Input for the program; held until it has started."""
        if self._execution is None:
            self._pending_stdin.append(data)
        else:
            await self._execution.write_stdin(data)

    async def close_stdin(self) -> None:
        self.stdin_closed = True
        if self._execution is None:
            self._pending_stdin.append(None)
        else:
            await self._execution.close_stdin()

    async def _bind(self, execution: Execution) -> None:
        self._execution = execution
        for data in self._pending_stdin:
            await (execution.close_stdin() if data is None else execution.write_stdin(data))
        self._pending_stdin.clear()
        if self._pending_size is not None:
            await execution.resize(*self._pending_size)
        if self.cancelled or self.output_exceeded:
            execution.kill()

    def cancel(self) -> None:
        self.cancelled = True
        self._kill()

    async def resize(self, rows: int, cols: int) -> None:
        """Set the terminal size of a tty run."""
        if not self.tty:
            raise ValueError("resize: this run has no terminal")
        if not (0 < rows <= 1000 and 0 < cols <= 1000):
            raise ValueError("resize: rows and cols must be between 1 and 1000")
        if self._execution is None:
            self._pending_size = (rows, cols)
        else:
            await self._execution.resize(rows, cols)

    async def result(self) -> RunResult:
        assert self._task is not None
        return await asyncio.shield(self._task)

    def _kill(self) -> None:
        if self._execution is not None:
            self._execution.kill()

    def _verdict(self, status: ExitStatus) -> Verdict:
        if self.cancelled:
            return Verdict.CANCELLED
        if self.output_exceeded:
            return Verdict.OUTPUT_LIMIT
        if status.oom_killed:
            return Verdict.MEMORY_LIMIT
        if self.timed_out or status.cpu_seconds >= self.limits.cpu_seconds or status.signal == signal.SIGXCPU:
            return Verdict.TIME_LIMIT
        if status.exit_code == 0 and status.signal is None:
            return Verdict.OK
        return Verdict.RUNTIME_ERROR

    def _result(self, verdict: Verdict, status: ExitStatus, wall: float, message: str = "") -> RunResult:
        return RunResult(
            verdict=verdict,
            exit_code=status.exit_code,
            signal=status.signal,
            cpu_seconds=round(status.cpu_seconds, 4),
            wall_seconds=round(wall, 4),
            peak_memory_bytes=status.peak_memory_bytes,
            stdout=bytes(self._out["stdout"]),
            stderr=bytes(self._out["stderr"]),
            message=message,
        )


async def _watch(run: SandboxRun, execution: Execution, waiter: asyncio.Future[ExitStatus], spec: RunSpec,
                 meter: RunCgroup | None) -> None:
    """Until the run exits, stop it at its wall-clock limit or once its processes together have used
    its CPU time (the cgroup's total: RLIMIT_CPU, the backstop, counts each process on its own).

    An interactive run's wall clock stands still while its program waits for input, or listens on a
    port for requests (a web app in the Webview), and is idle (sandbox.waiting), up to
    spec.input_wait_seconds per wait."""
    limits, patience = spec.limits, spec.input_wait_seconds
    last = time.monotonic()
    deadline = last + limits.wall_seconds
    waiting_since: float | None = None
    cpu = 0.0
    watched = patience is not None and meter is not None
    while not waiter.done():
        now = time.monotonic()
        used, cpu = cpu, meter.cpu_seconds() if meter is not None else 0.0
        pids = meter.pids() if watched and meter is not None else []
        ports = listening_ports(pids)
        port = (PREFERRED_PORT if PREFERRED_PORT in ports else min(ports)) if ports else None
        # Idle too: a thread blocked on input must not pause the clock for another that works.
        idle = watched and cpu - used < IDLE_CPU_SHARE * (now - last)
        waiting = idle and not run.stdin_closed and waiting_for_input(pids)
        if waiting or (idle and port is not None):
            deadline += now - last
            waiting_since = waiting_since if waiting_since is not None else now
        else:
            waiting_since = None
        last = now
        if (waiting, port) != (run.waiting_for_input, run.listening_port):
            run.waiting_for_input, run.listening_port = waiting, port
            run.on_change()
        if waiting_since is not None and patience is not None and now - waiting_since >= patience:
            what = "input or request" if port is not None else "input"
            run.limit_message = f"no {what} for {_duration(patience)}: the program was stopped"
            break
        if now >= deadline or cpu >= limits.cpu_seconds:
            break
        await asyncio.wait({waiter}, timeout=min(CPU_POLL_SECONDS, deadline - now))
    else:
        return
    run.timed_out = True
    execution.kill()


async def _sync_back(run: SandboxRun, spec: RunSpec, workspace: Path, snapshot: Snapshot, stop: asyncio.Event) -> None:
    """Until `stop`, copy what the run wrote back every spec.sync_seconds (only what changed since the last
    copy), so the project's tree shows a Shell's files while it is open; the copy at the end is the last word."""
    assert spec.sync_seconds is not None
    while True:
        with suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), spec.sync_seconds)
        if stop.is_set():
            return
        try:
            report = await asyncio.to_thread(copy_out, workspace, Path(spec.project_dir), snapshot,
                                             max_bytes=spec.limits.disk_bytes, max_files=spec.limits.files_count)
        except OSError as exc:
            log.warning("syncing run %s back failed: %s", run.id, exc)
            continue
        snapshot.files.update(report.copied)
        if report.written:
            run.on_files_copied()


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g} minutes" if seconds >= 120 else f"{seconds:g} s"


class Backend(abc.ABC):
    """A way to isolate a run. Subclasses implement `launch`; `start` is the same for all."""

    name: ClassVar[str]

    @classmethod
    @abc.abstractmethod
    def unavailable_reason(cls) -> str | None:
        """None when this backend can run code here, else why not and how to fix it."""

    @abc.abstractmethod
    async def launch(self, ctx: RunContext) -> Execution:
        """Start spec.command in isolation over ctx.workspace at /workspace, running as ctx.uid."""

    async def start(self, spec: RunSpec) -> SandboxRun:
        """Start a run in the background and return its handle at once."""
        run = SandboxRun(spec.limits, spec.tty)
        run._task = asyncio.create_task(self._drive(run, spec))
        return run

    async def run(self, spec: RunSpec, stdin: bytes = b"") -> RunResult:
        """Run to completion with the given input (output is in the result)."""
        started = await self.start(spec)
        if stdin:
            await started.send_stdin(stdin)
        await started.close_stdin()
        return await started.result()

    async def _drive(self, run: SandboxRun, spec: RunSpec) -> RunResult:
        """The whole life of a run; whatever fails, it ends with one verdict and nothing left behind."""
        began = time.monotonic()
        try:
            with run_uid() as uid:
                cgroup = RunCgroup.create(f"run-{uid}-{run.id}", spec.limits.memory_bytes, spec.limits.pids)
                try:
                    return await self._in_workspace(run, spec, uid, cgroup)
                finally:
                    if cgroup is not None:
                        cgroup.kill_all()
                        cgroup.remove()
        except WorkspaceTooLarge as exc:
            return run._result(Verdict.INTERNAL_ERROR, ExitStatus(), time.monotonic() - began, str(exc))
        except Exception as exc:
            log.exception("sandbox run %s failed", run.id)
            return run._result(Verdict.INTERNAL_ERROR, ExitStatus(), time.monotonic() - began, f"sandbox error: {exc}")
        finally:
            run._queue.put_nowait(None)

    async def _in_workspace(self, run: SandboxRun, spec: RunSpec, uid: int, cgroup: RunCgroup | None) -> RunResult:
        limits = spec.limits
        with scratch(limits.disk_bytes, limits.files_count * 2 + 64, uid) as ws:
            snapshot = await asyncio.to_thread(
                copy_in, Path(spec.project_dir), ws, max_bytes=limits.disk_bytes, max_files=limits.files_count, owner=uid
            )
            for mount in spec.mounts:
                if mount.owned_by_run:
                    os.chown(mount.source, uid, uid)
            began = time.monotonic()
            execution = await self.launch(RunContext(spec, ws, uid, cgroup, run))
            stop_sync = asyncio.Event()
            syncing = asyncio.create_task(_sync_back(run, spec, ws, snapshot, stop_sync)) if spec.sync_seconds else None
            try:
                await run._bind(execution)
                waiter = asyncio.ensure_future(execution.wait())
                try:
                    await _watch(run, execution, waiter, spec, execution.cgroup() or cgroup)
                    status = await waiter
                except asyncio.CancelledError:
                    run.cancelled = True
                    execution.kill()
                    await waiter
                    raise
                wall = time.monotonic() - began
            finally:
                execution.kill()
                if cgroup is not None:
                    cgroup.kill_all()
                kill_uid(uid)
                await execution.cleanup()
                if syncing is not None:  # let a copy under way finish before the last one
                    stop_sync.set()
                    await syncing
            if cgroup is not None:
                status.cpu_seconds = max(status.cpu_seconds, cgroup.cpu_seconds())
                status.peak_memory_bytes = max(status.peak_memory_bytes, cgroup.peak_memory())
                status.oom_killed = status.oom_killed or cgroup.oom_killed()
            result = run._result(run._verdict(status), status, wall, run.limit_message)
            report = await asyncio.to_thread(
                copy_out, ws, Path(spec.project_dir), snapshot, max_bytes=limits.disk_bytes, max_files=limits.files_count
            )
            result.files_written = report.written
            result.files_skipped = snapshot.skipped + report.skipped
            result.message = "\n".join(filter(None, (result.message, report.notice())))
            return result
