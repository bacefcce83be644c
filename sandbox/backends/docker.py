"""The Docker backend: hardened, throwaway containers, optionally taken from a warm pool.

No network, every capability dropped, no-new-privileges, the shared seccomp policy, read-only
root with a size-limited /tmp, pids, memory (= memory+swap), CPU, nofile, fsize and cpu-time
limits, a non-root per-run uid, an init process, no logs kept (output comes from the attach
stream). Each container serves one run and is removed afterwards.

Creating and starting a container costs ~0.4 s, so a warm pool keeps a few started, idle
containers for the server's default limits: a run then costs one `docker exec` into a fresh
container, whose /workspace is a propagating bind the run's workspace is mounted onto.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import socket
import struct
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sandbox.backend import WORKSPACE, Backend, Execution, ExitStatus, Mount, RunContext, SandboxRun
from sandbox.backends.dockerd import docker_client
from sandbox.cgroups import RunCgroup, remove_cgroup
from sandbox.image import RUNNER_IMAGE
from sandbox.limits import Limits
from sandbox.seccomp import docker_profile
from sandbox.workspace import bind, kill_uid, make_shared_mountpoint, runs_root, umount

LABEL = "codeyard.sandbox"
POOL_LABEL = "codeyard.sandbox.pool"
IDLE_USER = "65534:65534"
SIZE_TERMINAL = 'stty rows "$1" cols "$2"; shift 2; exec "$@"'
_STREAMS: dict[int, Literal["stdout", "stderr"]] = {1: "stdout", 2: "stderr"}
# Docker API calls block; they get their own pool so many runs don't starve asyncio's default one.
_pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="codeyard-docker")


def container_config(limits: Limits, image: str, *, command: list[str], user: str, environment: dict[str, str],
                     workspace: str, propagation: str, cgroup_parent: str | None, labels: dict[str, str],
                     tty: bool = False, mounts: tuple[Mount, ...] = ()) -> dict[str, Any]:
    """Keyword arguments for containers.create: the hardening lives here, in one place."""
    import docker.types

    cpu = math.ceil(limits.cpu_seconds)
    return dict(
        image=image,
        command=command,
        user=user,
        working_dir=WORKSPACE,
        environment=environment,
        hostname="sandbox",
        network_mode="none",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges", f"seccomp={docker_profile()}"],
        read_only=True,
        tmpfs={"/tmp": f"size={limits.disk_bytes},mode=1777,exec,nosuid,nodev"},
        shm_size=min(limits.disk_bytes, 64 << 20),
        ipc_mode="private",
        pids_limit=limits.pids,
        mem_limit=limits.memory_bytes,
        memswap_limit=limits.memory_bytes,
        nano_cpus=1_000_000_000,
        ulimits=[
            docker.types.Ulimit(name="nofile", soft=limits.open_files, hard=limits.open_files),
            docker.types.Ulimit(name="fsize", soft=limits.file_bytes, hard=limits.file_bytes),
            docker.types.Ulimit(name="cpu", soft=cpu, hard=cpu + 1),
            docker.types.Ulimit(name="core", soft=0, hard=0),
        ],
        init=True,
        log_config=docker.types.LogConfig(type="none"),
        volumes={workspace: {"bind": WORKSPACE, "mode": f"rw,{propagation}"},
                 **{str(m.source): {"bind": m.target, "mode": "rw" if m.writable else "ro"} for m in mounts}},
        stdin_open=True,  # with detach left False this also sets StdinOnce: closing our end closes theirs
        tty=tty,
        cgroup_parent=cgroup_parent,
        labels=labels,
    )


def _pool_key(limits: Limits) -> tuple[object, ...]:
    """The limits baked into a container at creation; a warm container fits runs with the same ones."""
    return (limits.memory_bytes, limits.pids, limits.open_files, limits.file_bytes, math.ceil(limits.cpu_seconds), limits.disk_bytes)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            return b""
        buf += chunk
    return bytes(buf)


def _remove(container: Any) -> None:  # a docker Container (the library ships no types)
    import docker.errors

    try:
        container.remove(force=True, v=True)
    except docker.errors.NotFound:
        pass


def _exit_status(code: int) -> ExitStatus:
    """docker-init and exec report death by signal as 128 + signal."""
    return ExitStatus(signal=code - 128) if code > 128 else ExitStatus(exit_code=code)


class _Attached(Execution):
    """A process whose stdio is a Docker attach stream (8-byte frame headers, stdin on the same socket)."""

    def __init__(self, sock: socket.socket, run: SandboxRun, loop: asyncio.AbstractEventLoop, tty: bool = False) -> None:
        self.sock, self.run, self.loop, self.tty = sock, run, loop, tty
        self.output_done = loop.create_future()
        reader = self._read_raw if tty else self._read
        threading.Thread(target=reader, name=f"codeyard-attach-{run.id}", daemon=True).start()

    def _done(self) -> None:
        self.loop.call_soon_threadsafe(self._set_output_done)

    def _set_output_done(self) -> None:
        if not self.output_done.done():
            self.output_done.set_result(None)

    def _read_raw(self) -> None:
        """A terminal's stream is not multiplexed: everything is the terminal's output."""
        try:
            while data := self.sock.recv(65536):
                self.loop.call_soon_threadsafe(self.run.emit, "stdout", data)
        except OSError:
            pass
        finally:
            self._done()

    def _read(self) -> None:
        try:
            while header := _recv_exact(self.sock, 8):
                stream, size = header[0], struct.unpack(">I", header[4:])[0]
                data = _recv_exact(self.sock, size)
                if stream in _STREAMS and data:
                    self.loop.call_soon_threadsafe(self.run.emit, _STREAMS[stream], data)
        except OSError:
            pass
        finally:
            self._done()

    async def write_stdin(self, data: bytes) -> None:
        try:
            await self.loop.run_in_executor(_pool, self.sock.sendall, data)
        except OSError:
            pass

    async def close_stdin(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class _ContainerExecution(_Attached):
    """A run that is a container's own command (the cold path)."""

    def __init__(self, container: Any, sock: socket.socket, run: SandboxRun, loop: asyncio.AbstractEventLoop, tty: bool) -> None:
        super().__init__(sock, run, loop, tty)
        self.container = container
        self._killed = False
        self._size: tuple[int, int] | None = None

    async def resize(self, rows: int, cols: int) -> None:
        if not self.tty:
            raise ValueError("resize: this run has no terminal")
        self._size = (rows, cols)
        await self.loop.run_in_executor(_pool, self._apply_size)

    def _apply_size(self) -> None:
        import docker.errors

        if self._size is not None:
            try:
                self.container.resize(height=self._size[0], width=self._size[1])
            except docker.errors.APIError:
                pass


    def kill(self) -> None:
        if not self._killed:
            self._killed = True
            self.loop.run_in_executor(_pool, self._kill_quietly)

    def _kill_quietly(self) -> None:
        import docker.errors

        try:
            self.container.kill()
        except docker.errors.APIError:
            pass

    async def wait(self) -> ExitStatus:
        outcome = await self.loop.run_in_executor(_pool, self.container.wait)
        await self.output_done
        await self.loop.run_in_executor(_pool, self.container.reload)
        status = _exit_status(int(outcome.get("StatusCode", -1)))
        status.oom_killed = bool(self.container.attrs["State"].get("OOMKilled"))
        return status

    async def cleanup(self) -> None:
        self.sock.close()
        await self.loop.run_in_executor(_pool, _remove, self.container)


@dataclass
class _Warm:
    """A started container idling (as nobody) with an empty propagating /workspace."""

    container: Any  # a docker Container
    slot: Path  # host mount point bound at /workspace with rslave propagation


class _ExecExecution(_Attached):
    """A run exec'd into a warm container; processes are killed by uid, the container is discarded after."""

    def __init__(self, backend: DockerBackend, warm: _Warm, exec_id: str, sock: socket.socket, ctx: RunContext,
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(sock, ctx.run, loop)
        self.backend, self.warm, self.exec_id, self.uid = backend, warm, exec_id, ctx.uid
        self._cgroup = RunCgroup.existing(f"{backend.pool_cgroup}/{warm.container.id}")

    def cgroup(self) -> RunCgroup | None:
        """The container's cgroup: it serves this run only, so its figures are the run's."""
        return self._cgroup

    def kill(self) -> None:
        kill_uid(self.uid, once=True)

    async def wait(self) -> ExitStatus:
        await self.output_done
        api = self.backend.client.api
        while (info := await self.loop.run_in_executor(_pool, api.exec_inspect, self.exec_id))["Running"]:
            kill_uid(self.uid, once=True)  # output closed but the process lingers: it is ending
            await asyncio.sleep(0.01)
        status = _exit_status(int(info["ExitCode"] if info["ExitCode"] is not None else -1))
        if self._cgroup is not None:
            status.cpu_seconds, status.peak_memory_bytes = self._cgroup.cpu_seconds(), self._cgroup.peak_memory()
            status.oom_killed = self._cgroup.oom_killed()
        return status

    async def cleanup(self) -> None:
        self.sock.close()
        kill_uid(self.uid)
        umount(self.warm.slot)  # the run's workspace leaves the container before the run's uid is reused
        self.backend._discard(self.warm)


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, client: Any = None, image: str = RUNNER_IMAGE, *, pool_limits: Limits | None = None, pool_size: int = 0) -> None:
        self.client = client or docker_client()
        if self.client is None:
            raise RuntimeError("no Docker engine answers")
        self.image = image
        self.pool_limits, self.pool_size = pool_limits or Limits(), pool_size
        self.pool_cgroup = (RunCgroup.base_relpath() or "/codeyard") + "/pool"
        self.pool_hits = 0
        self._ready: list[_Warm] = []
        self._filling = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def unavailable_reason(cls) -> str | None:
        client = docker_client(timeout=5)
        if client is None:
            return "no Docker engine answers (apt-get install docker.io and start dockerd, or set DOCKER_HOST)"
        import docker.errors

        try:
            client.images.get(RUNNER_IMAGE)
        except docker.errors.ImageNotFound:
            return f"the runner image {RUNNER_IMAGE} is missing (run `codeyard sandbox build-image`)"
        return None

    async def launch(self, ctx: RunContext) -> Execution:
        warm_fits = not ctx.spec.tty and not ctx.spec.mounts and _pool_key(ctx.spec.limits) == _pool_key(self.pool_limits)
        if self.pool_size and warm_fits:  # a warm container has no extra mounts: runs with packages start cold
            warm = self._ready.pop(0) if self._ready else None
            self._refill()
            if warm is not None:
                self.pool_hits += 1
                return await self._exec(warm, ctx)
        return await self._cold(ctx)

    async def _cold(self, ctx: RunContext) -> Execution:
        loop = asyncio.get_running_loop()
        command = ctx.spec.command
        if ctx.spec.terminal:  # the engine can drop a resize sent while the container starts: size it first
            command = ["/bin/sh", "-c", SIZE_TERMINAL, "sh", *map(str, ctx.spec.terminal), *command]
        config = container_config(
            ctx.spec.limits, self.image, command=command, user=f"{ctx.uid}:{ctx.uid}",
            environment=ctx.spec.environment(), workspace=str(ctx.workspace), propagation="rprivate",
            cgroup_parent=ctx.cgroup.relpath if ctx.cgroup else None, labels={LABEL: ctx.run.id}, tty=ctx.spec.tty,
            mounts=tuple(ctx.spec.mounts),
        )
        try:
            container = await loop.run_in_executor(_pool, lambda: self.client.containers.create(**config))
        except BaseException:  # the engine may have made it even though the call failed
            await loop.run_in_executor(_pool, self._remove_run_containers, ctx.run.id)
            raise
        try:
            params = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            raw = await loop.run_in_executor(_pool, lambda: self.client.api.attach_socket(container.id, params=params))
            execution = _ContainerExecution(container, raw._sock, ctx.run, loop, ctx.spec.tty)
            await loop.run_in_executor(_pool, container.start)
        except BaseException:
            await loop.run_in_executor(_pool, _remove, container)
            raise
        return execution

    def _remove_run_containers(self, run_id: str) -> None:
        for container in self.client.containers.list(all=True, filters={"label": f"{LABEL}={run_id}"}):
            _remove(container)

    async def _exec(self, warm: _Warm, ctx: RunContext) -> Execution:
        loop = asyncio.get_running_loop()
        bind(ctx.workspace, warm.slot)
        try:
            api = self.client.api
            created = await loop.run_in_executor(_pool, lambda: api.exec_create(
                warm.container.id, ctx.spec.command, stdin=True, user=f"{ctx.uid}:{ctx.uid}",
                environment=ctx.spec.environment(), workdir=WORKSPACE))
            raw = await loop.run_in_executor(_pool, lambda: api.exec_start(created["Id"], socket=True))
        except BaseException:
            umount(warm.slot)
            self._discard(warm)
            raise
        return _ExecExecution(self, warm, created["Id"], raw._sock, ctx, loop)

    def _refill(self) -> None:
        while len(self._ready) + self._filling < self.pool_size:
            self._filling += 1
            self._spawn(self._add_warm())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _add_warm(self) -> None:
        loop = asyncio.get_running_loop()
        slot = runs_root() / f"pool-{secrets.token_hex(6)}"
        slot.mkdir(mode=0o755)
        try:
            make_shared_mountpoint(slot)
            config = container_config(
                self.pool_limits, self.image, command=["sleep", "infinity"], user=IDLE_USER, environment={},
                workspace=str(slot), propagation="rslave", cgroup_parent=self.pool_cgroup, labels={POOL_LABEL: "idle"},
            )
            container = await loop.run_in_executor(_pool, lambda: self.client.containers.run(detach=True, **config))
        except BaseException:
            umount(slot)
            slot.rmdir()
            raise
        finally:
            self._filling -= 1
        self._ready.append(_Warm(container, slot))

    def _discard(self, warm: _Warm) -> None:
        """Remove a used or unwanted warm container in the background."""
        async def remove() -> None:
            await asyncio.get_running_loop().run_in_executor(_pool, _remove, warm.container)
            umount(warm.slot)
            warm.slot.rmdir()
        self._spawn(remove())

    async def warm_up(self) -> None:
        """Fill the pool now (rather than on the first run) and wait until it is full."""
        self._refill()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Remove idle containers and wait for pending removals: nothing of the pool is left."""
        self.pool_size = 0
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        while self._ready:
            self._discard(self._ready.pop())
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        remove_cgroup(self.pool_cgroup)
