"""Long-lived sandboxed processes reached through a unix socket: a deployed app's instances.

The process is launched by the runs' own backend, so it gets their hardening (bubblewrap: new
user/pid/net/ipc/mount namespaces; Docker: a container with network "none"; both: no
capabilities, the seccomp policy, read-only system folders, a quota'd tmpfs workspace) plus its
own cgroup (memory, pids, a CPU quota) and a host uid from a range runs never use. Its network
namespace is empty: it cannot reach the host, other apps or the internet. A small bridge started
inside the sandbox listens on a unix socket in a folder only this process mounts, and connects
each accepted stream to 127.0.0.1:$PORT, where the app listens; only the host side opens that socket
(the IDE's proxy on the same machine, or a runner node's relay, sandbox.app_relay).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import stat
import threading
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from sandbox.backend import Backend, Execution, ExitStatus, Mount, RunContext, RunSpec, SandboxRun
from sandbox.cgroups import RUNS_FOLDER, RunCgroup, cgroup_dirs, remove_cgroup
from sandbox.errors import SandboxUnavailable
from sandbox.files import copy_in
from sandbox.host_lease import lease_uid
from sandbox.limits import Limits
from sandbox.socket_relay import UNIX_TO_TCP
from sandbox.workspace import kill_uid, runs_root, scratch

APP_UID_BASE = 640000  # runs use 620000..624095; apps have a range of their own
APP_UID_COUNT = 1024
SOCKET_DIR = "/run/codeyard-app"
SOCKET_NAME = "app.sock"
APPS_CGROUP = "codeyard-apps"

# Runs inside the sandbox: listen on argv[1] (a unix socket), start the app (argv[4:]) and join each
# accepted connection to 127.0.0.1:argv[2]; exits with the app's status when the app exits.
BRIDGE = UNIX_TO_TCP + r"""
import signal, subprocess, sys
path, port = sys.argv[1], int(sys.argv[2])
app = subprocess.Popen(sys.argv[4:])
signal.signal(signal.SIGTERM, lambda *_: app.terminate())
serve_unix(path, lambda: port)
code = app.wait()
sys.exit(code if code >= 0 else 128 - code)
"""

Stream = Literal["stdout", "stderr"]


@dataclass
class HostedSpec:
    """What one hosted process runs: the folder copied into its workspace, its command, and its bounds."""

    release_dir: Path
    argv: list[str]
    port: int  # where the app listens inside its sandbox
    limits: Limits
    env: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    cpus: float = 1.0  # its cgroup's CPU quota


def app_cgroup(name: str, limits: Limits, cpus: float = 1.0) -> RunCgroup | None:
    """A hosted process's cgroup (memory, pids, a quota of `cpus`), or None where the host gives none. On cgroup v1
    it goes beside the runs' folder (sandbox tests check that folder empties after every run; an
    app outlives them)."""
    return RunCgroup.create(name, limits.memory_bytes, limits.pids, folder=APPS_CGROUP, cpus=cpus)


def remove_stale_cgroups(kind: Literal["app", "run"] = "app") -> list[str]:
    """At start-up: remove the cgroups of hosted apps, or of sandbox runs, that a process that died left (a runner
    killed, then started again on the host or in the same container), those whose uid nobody leases now: a live run or app of any process holds its uid
    host-wide from before its cgroup is made until after it is removed."""
    removed: list[str] = []
    base = RunCgroup.base_relpath(APPS_CGROUP if kind == "app" else RUNS_FOLDER)
    if base is None:
        return removed
    names = {child.name for folder in cgroup_dirs(base) for child in folder.iterdir() if child.is_dir()}
    for name in sorted(names):
        prefix, _, rest = name.partition("-")
        uid = rest.partition("-")[0]
        if prefix == kind and uid.isdigit() and (fd := lease_uid(int(uid))) is not None:
            try:
                kill_uid(int(uid))
                remove_cgroup(f"{base}/{name}")
                removed.append(name)
            finally:
                os.close(fd)
    return removed


class _Uids:
    """Host uids of live hosted processes, one each, leased host-wide (another server on this host,
    or a test session, never gets the same one), so cleanup can find and kill every process of one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: dict[int, int] = {}  # uid -> lease descriptor

    def take(self) -> int:
        with self._lock:
            for uid in range(APP_UID_BASE, APP_UID_BASE + APP_UID_COUNT):
                if uid in self._leases or (fd := lease_uid(uid)) is None:
                    continue
                kill_uid(uid)  # nobody holds it: anything still running as it was left by a server that died
                self._leases[uid] = fd
                return uid
        raise SandboxUnavailable("too many running apps: no free app uid")

    def give_back(self, uid: int) -> None:
        kill_uid(uid)
        with self._lock:
            os.close(self._leases.pop(uid))


UIDS = _Uids()


class _Output(SandboxRun):
    """The app's output, as whole lines, goes to `sink` (a deployment's log), never bounded by a run's output limit."""

    MAX_LINE = 8192

    def __init__(self, limits: Limits, sink: Callable[[Stream, str], None]) -> None:
        super().__init__(limits)
        self._sink = sink
        self._partial: dict[Stream, str] = {"stdout": "", "stderr": ""}

    def emit(self, stream: Stream, data: bytes) -> None:
        text = self._partial[stream] + data.decode("utf-8", "replace")
        *lines, rest = text.split("\n")
        for line in lines:
            self._sink(stream, line + "\n")
        if len(rest) > self.MAX_LINE:
            self._sink(stream, rest)
            rest = ""
        self._partial[stream] = rest

    def flush(self) -> None:
        for stream, rest in self._partial.items():
            if rest:
                self._sink(stream, rest + "\n")
            self._partial[stream] = ""


class ExitFollowed:
    """What a hosted process says of its end, wherever it runs: set `_exit` when it starts."""

    _exit: asyncio.Future[ExitStatus] | None = None

    @property
    def exited(self) -> bool:
        return self._exit is not None and self._exit.done()

    async def wait_exit(self) -> ExitStatus:
        """The ExitStatus once the app (and its sandbox) ended."""
        assert self._exit is not None
        return await asyncio.shield(self._exit)


class HostedApp(ExitFollowed):
    """One hosted process on this machine: start, seal its socket, wait for its exit, stop (idempotent)."""

    def __init__(self, backend: Backend, spec: HostedSpec, sink: Callable[[Stream, str], None]) -> None:
        self.backend, self.spec, self.sink = backend, spec, sink
        self.id = secrets.token_hex(4)
        self.socket_dir = runs_root() / f"app-{self.id}"  # beside the workspaces: a folder the app's uid can reach
        self.socket_path = self.socket_dir / SOCKET_NAME
        self.address = str(self.socket_path)  # what a client connects to (here: the socket itself)
        self.preamble = b""  # what a client sends first on each connection (here: nothing)
        self.lost: str | None = None  # (its exit is always the app's own here)
        self._stack = ExitStack()
        self._execution: Execution | None = None
        self._output: _Output | None = None
        self._cgroup: RunCgroup | None = None
        self._uid: int | None = None
        self._sealed = False  # the socket folder taken back from the app (see socket_ready)

    async def start(self) -> None:
        """Launch the sandbox (returns once it runs; `socket_ready` says when the bridge listens)."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        limits = self.spec.limits
        self._uid = uid = UIDS.take()
        self._cgroup = app_cgroup(f"app-{uid}-{self.id}", limits, self.spec.cpus)
        workspace = self._stack.enter_context(scratch(limits.disk_bytes, limits.files_count * 2 + 64, uid))
        await asyncio.to_thread(copy_in, self.spec.release_dir, workspace, max_bytes=limits.disk_bytes,
                                max_files=limits.files_count, owner=uid)
        self.socket_dir.mkdir(parents=True)
        os.chown(self.socket_dir, uid, uid)
        os.chmod(self.socket_dir, 0o700)
        port = str(self.spec.port)
        argv = ["python3", "-c", BRIDGE, f"{SOCKET_DIR}/{SOCKET_NAME}", port, "--", *self.spec.argv]
        run = RunSpec(argv, self.spec.release_dir, limits, {**self.spec.env, "PORT": port},
                      mounts=(Mount(self.socket_dir, SOCKET_DIR, writable=True), *self.spec.mounts))
        self._output = _Output(limits, self.sink)
        self._execution = await self.backend.launch(RunContext(run, workspace, uid, self._cgroup, self._output))
        self._exit = asyncio.ensure_future(self._execution.wait())

    def socket_ready(self) -> bool:
        """Whether the bridge has bound its socket. The first time it has, the folder is taken back
        from the app (root's, and read-only to it), so the name can no longer be swapped for a link
        to a host socket (the Docker daemon's, say), where every visitor's request would then go.
        PermissionError if what stands there is not a socket of the app's own."""
        if self._sealed:
            return True
        if not os.path.lexists(self.socket_path):
            return False
        os.chown(self.socket_dir, 0, 0)
        os.chmod(self.socket_dir, 0o755)
        found = os.lstat(self.socket_path)
        if not stat.S_ISSOCK(found.st_mode) or found.st_uid != self._uid:
            raise PermissionError(f"the app replaced its socket ({SOCKET_DIR}/{SOCKET_NAME}) with something else; "
                                  "only the bridge may listen there")
        self._sealed = True
        return True

    async def stop(self) -> None:
        """Kill everything of the process and release its uid, cgroup, workspace and socket (idempotent)."""
        if self._execution is not None:
            self._execution.kill()
        if self._cgroup is not None:
            self._cgroup.kill_all()
        if self._uid is not None:
            kill_uid(self._uid)
        if self._exit is not None:
            await asyncio.gather(self._exit, return_exceptions=True)
        if self._execution is not None:
            await self._execution.cleanup()
            self._execution = None
        if self._output is not None:
            self._output.flush()
        self._stack.close()
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        if self._cgroup is not None:
            self._cgroup.remove()
            self._cgroup = None
        if self._uid is not None:
            UIDS.give_back(self._uid)
            self._uid = None


class Hosted(Protocol):
    """A hosted process wherever it runs: this machine (HostedApp) or a runner node (sandbox.backends.remote_apps)."""

    address: str  # a unix socket's path, or "host:port" of the relay in front of it
    preamble: bytes  # sent first on every connection to `address`
    lost: str | None  # why it ended, when that was not the app's own exit (its runner went away)

    async def start(self) -> None: ...

    @property
    def exited(self) -> bool: ...

    async def wait_exit(self) -> ExitStatus: ...

    def socket_ready(self) -> bool: ...

    async def stop(self) -> None: ...


class Hosting(Protocol):
    """Where hosted processes start: on this machine, or on runner nodes chosen by their free capacity."""

    def host(self, spec: HostedSpec, sink: Callable[[Stream, str], None]) -> Hosted: ...


@dataclass
class LocalHosting:
    """Hosted processes on this machine, with its own sandbox backend."""

    backend: Backend

    def host(self, spec: HostedSpec, sink: Callable[[Stream, str], None]) -> Hosted:
        return HostedApp(self.backend, spec, sink)
