"""One running copy of a release: a hosted sandboxed process (sandbox.hosted) on this machine or on a runner
node, health-checked and counted while it serves requests.

Where it runs is the `Hosting`'s choice: a lone server hosts its apps itself (`LocalHosting`), replicas
that send runs to runner nodes place app instances on them too (`RunnerHosting`, by free capacity).
Either way the instance is reached at one `address` (the app's unix socket, or the relay in front of it
on its runner) with a `preamble` sent first on each connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from deploy_service.detect import PORT
from deploy_service.upstream import Upstream, UpstreamError
from sandbox import MIB, ExitStatus, Hosted, HostedSpec, Hosting, Limits, Mount, Stream

HEALTH_ERRORS = 5  # error answers (5xx) in a row that fail a health check
# cpu_seconds/wall_seconds are per-run bounds; an app runs until stopped (its CPU use is bounded by the quota)
APP_LIMITS = Limits(cpu_seconds=10**9, wall_seconds=10**9, memory_bytes=256 * MIB, pids=192, output_bytes=1,
                    file_bytes=16 * MIB, open_files=1024, disk_bytes=128 * MIB, files_count=5000)


@dataclass
class Launch:
    """What every instance of a release runs with."""

    release_dir: Path
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    health_path: str = "/"
    limits: Limits = APP_LIMITS
    cpus: float = 1.0  # each instance's CPU quota

    def hosted_spec(self) -> HostedSpec:
        return HostedSpec(self.release_dir, self.argv, PORT, self.limits, self.env, self.mounts, self.cpus)


class AppInstance:
    """Start, health-check, count requests in flight, and stop one instance."""

    def __init__(self, hosting: Hosting, launch: Launch, sink: Callable[[Stream, str], None]) -> None:
        self.launch = launch
        self.process: Hosted = hosting.host(launch.hosted_spec(), sink)
        self.in_flight = 0
        self.started_at = 0.0
        self.stopping = False
        self.upstream: Upstream | None = None

    @property
    def address(self) -> str:
        return self.process.address

    @property
    def preamble(self) -> bytes:
        return self.process.preamble

    async def start(self) -> None:
        """Launch the sandbox (returns once it runs; `wait_healthy` says when the app answers)."""
        await self.process.start()
        self.started_at = time.monotonic()

    @property
    def exited(self) -> bool:
        return self.process.exited

    async def wait_exit(self) -> ExitStatus:
        """The ExitStatus once the app (and its sandbox) ended."""
        return await self.process.wait_exit()

    def how_it_ended(self, status: ExitStatus) -> str:
        if self.process.lost:
            return self.process.lost
        return f"signal {status.signal}" if status.signal else f"exit code {status.exit_code}"

    async def wait_healthy(self, timeout: float) -> str | None:
        """None once the health path answers below 500; else why not (exited, kept failing, or the timeout)."""
        deadline = time.monotonic() + timeout
        last, errors = "no answer", 0
        while time.monotonic() < deadline and errors < HEALTH_ERRORS:
            if self.process.exited:
                return f"the app exited ({self.how_it_ended(await self.process.wait_exit())}) before answering its health check"
            try:
                ready = self.process.socket_ready()
            except PermissionError as exc:
                return str(exc)
            if ready:
                if self.upstream is None:  # (a runner says where its relay listens once the socket is there)
                    self.upstream = Upstream(self.process.address, self.process.preamble)
                try:
                    response = await asyncio.wait_for(self._get(self.launch.health_path), 5.0)
                    if response < 500:
                        return None
                    last, errors = f"HTTP {response} from {self.launch.health_path}", errors + 1
                    await asyncio.sleep(0.2)  # it answers, with an error: a few more tries, then give up
                except (TimeoutError, UpstreamError, OSError) as exc:
                    last = f"{type(exc).__name__} on {self.launch.health_path}"
            await asyncio.sleep(0.05)
        if errors >= HEALTH_ERRORS:
            return f"the health check failed: {last} ({errors} times)"
        return f"the health check of {self.launch.health_path} did not pass within {timeout:.0f} s (last: {last})"

    async def _get(self, path: str) -> int:
        """The status of GET path (its body read and dropped)."""
        assert self.upstream is not None
        response = await self.upstream.request("GET", path, [(b"host", b"app"), (b"user-agent", b"codeyard-health")])
        async for _ in response.body():
            pass
        return response.status

    async def drain(self, timeout: float) -> None:
        """Wait until the requests it is serving have ended (new ones no longer come to it)."""
        deadline = time.monotonic() + timeout
        while self.in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        """Kill everything of the instance and release what it held (idempotent)."""
        self.stopping = True
        if self.upstream is not None:
            self.upstream.close()
        await self.process.stop()
