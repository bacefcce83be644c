"""The Docker backend: one hardened, throwaway container per run.

No network, every capability dropped, no-new-privileges, read-only root with a size-limited /tmp,
pids, memory (= memory+swap), CPU, nofile, fsize and cpu-time limits, a non-root per-run uid, an
init process, no logs kept (output is taken from the attach stream). The container is removed in
all cases; its cgroup parent is the run's own cgroup, which keeps peak memory and CPU time after
the container is gone.
"""

from __future__ import annotations

import asyncio
import math
import socket
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

from sandbox.backend import WORKSPACE, Backend, ExitStatus, Execution, RunContext, SandboxRun
from sandbox.image import RUNNER_IMAGE
from sandbox.seccomp import docker_profile

LABEL = "codeyard.sandbox"
_STREAMS = {1: "stdout", 2: "stderr"}
# Docker API calls block; they get their own pool so many runs don't starve asyncio's default one.
_pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="codeyard-docker")


def container_config(ctx: RunContext, image: str) -> dict:
    """Keyword arguments for containers.create: the hardening lives here, in one place."""
    import docker.types

    limits = ctx.spec.limits
    cpu = math.ceil(limits.cpu_seconds)
    return dict(
        image=image,
        command=list(ctx.spec.argv),
        user=f"{ctx.uid}:{ctx.uid}",
        working_dir=WORKSPACE,
        environment=ctx.spec.environment(),
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
        volumes={str(ctx.workspace): {"bind": WORKSPACE, "mode": "rw"}},
        stdin_open=True,  # with detach left False this also sets StdinOnce: closing our end closes theirs
        cgroup_parent=ctx.cgroup.relpath if ctx.cgroup else None,
        labels={LABEL: ctx.run.id},
    )


class _DockerExecution(Execution):
    def __init__(self, client, container, sock: socket.socket, run: SandboxRun, loop: asyncio.AbstractEventLoop) -> None:
        self.client, self.container, self.sock, self.run, self.loop = client, container, sock, run, loop
        self.output_done = loop.create_future()
        self._killed = False
        threading.Thread(target=self._read, name=f"codeyard-attach-{run.id}", daemon=True).start()

    def _read(self) -> None:
        """Demultiplex the attach stream (8-byte frame headers) into the run's output."""
        try:
            while header := _recv_exact(self.sock, 8):
                stream, size = header[0], struct.unpack(">I", header[4:])[0]
                data = _recv_exact(self.sock, size)
                if stream in _STREAMS and data:
                    self.loop.call_soon_threadsafe(self.run.emit, _STREAMS[stream], data)
        except OSError:
            pass
        finally:
            self.loop.call_soon_threadsafe(lambda: self.output_done.done() or self.output_done.set_result(None))

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
        code = int(outcome.get("StatusCode", -1))
        status = ExitStatus(oom_killed=bool(self.container.attrs["State"].get("OOMKilled")))
        if code > 128:
            status.signal = code - 128
        else:
            status.exit_code = code
        return status

    async def cleanup(self) -> None:
        self.sock.close()
        await self.loop.run_in_executor(_pool, _remove, self.container)


def _remove(container) -> None:
    import docker.errors

    try:
        container.remove(force=True, v=True)
    except docker.errors.NotFound:
        pass


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            return b""
        buf += chunk
    return bytes(buf)


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, client=None, image: str = RUNNER_IMAGE) -> None:
        from sandbox.engine import docker_client

        self.client = client or docker_client()
        if self.client is None:
            raise RuntimeError("no Docker engine answers")
        self.image = image

    @classmethod
    def unavailable_reason(cls) -> str | None:
        from sandbox.engine import docker_client

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
        loop = asyncio.get_running_loop()
        container = await loop.run_in_executor(_pool, lambda: self.client.containers.create(**container_config(ctx, self.image)))
        try:
            params = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            raw = await loop.run_in_executor(_pool, lambda: self.client.api.attach_socket(container.id, params=params))
            sock = raw._sock
            sock.settimeout(None)
            execution = _DockerExecution(self.client, container, sock, ctx.run, loop)
            await loop.run_in_executor(_pool, container.start)
        except BaseException:
            await loop.run_in_executor(_pool, _remove, container)
            raise
        return execution
