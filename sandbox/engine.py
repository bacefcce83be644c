"""Finding a Docker engine, and choosing the backend (`auto`: Docker where an engine answers, else bubblewrap)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from sandbox.backend import Backend
from sandbox.limits import Limits
from sandbox.errors import SandboxUnavailable

INSTALL_HINT = (
    "no sandbox is available to run code: install Docker (apt-get install docker.io, then start dockerd) "
    "or bubblewrap (apt-get install bubblewrap) and run the server as root; Codeyard never runs code unsandboxed"
)


def docker_client(timeout: int = 60):
    """A client for the engine named by DOCKER_HOST (or the default socket), or None if none answers."""
    import docker
    import docker.errors

    try:
        # one HTTP connection per concurrent API call (the Docker backend's thread pool has 64)
        client = docker.from_env(timeout=timeout, max_pool_size=64)
        client.ping()
        return client
    except (docker.errors.DockerException, OSError):
        return None


def make_backend(name: str = "auto", *, pool_size: int = 0, pool_limits: Limits | None = None,
                 redis_url: str | None = None) -> Backend:
    """The backend called `name` ("auto", "docker", "bwrap", or "runners": runner nodes reached through
    Redis at redis_url), or SandboxUnavailable saying how to get one.

    pool_size/pool_limits: Docker's warm pool (idle started containers for runs with these limits)."""
    from sandbox.bwrap import BwrapBackend
    from sandbox.docker_backend import DockerBackend

    if name == "runners":
        return _runners(redis_url)
    if name not in ("auto", "docker", "bwrap"):
        raise ValueError(f"sandbox backend must be auto, docker, bwrap or runners, not {name!r}")
    reasons = []
    for cls in (DockerBackend, BwrapBackend):
        if name not in ("auto", cls.name):
            continue
        reason = cls.unavailable_reason()
        if reason is None:
            return DockerBackend(pool_size=pool_size, pool_limits=pool_limits) if cls is DockerBackend else cls()
        reasons.append(f"{cls.name}: {reason}")
    raise SandboxUnavailable(f"{INSTALL_HINT} ({'; '.join(reasons)})")


# Each run on a runner holds a connection while it waits for output (a blocking read): room for every
# queued, running and Shell run of a replica (Redis serves ten thousand clients by default).
REMOTE_CONNECTIONS = 1024


def _runners(redis_url: str | None) -> Backend:
    from ide_server.leases import connect
    from sandbox.remote import RemoteBackend

    if not redis_url:
        raise SandboxUnavailable("the runners sandbox backend needs Redis (set CODEYARD_REDIS_URL)")
    return RemoteBackend(connect(redis_url, REMOTE_CONNECTIONS))


class LocalDockerd:
    """A dockerd of our own (own socket, data-root, pidfile under state_dir), for tests and benchmarks."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir.resolve()  # dockerd needs absolute socket paths
        self.proc: subprocess.Popen[bytes] | None = None
        self._previous_host = os.environ.get("DOCKER_HOST")

    def start(self, timeout: float = 60):
        """Start dockerd, point DOCKER_HOST at it, and return a client once it answers."""
        if shutil.which("dockerd") is None:
            raise SandboxUnavailable("dockerd is not installed (apt-get install docker.io)")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        sock = self.state_dir / "docker.sock"
        with open(self.state_dir / "dockerd.log", "ab") as log:
            self.proc = subprocess.Popen(
                ["dockerd", "--data-root", str(self.state_dir / "data"), "--exec-root", str(self.state_dir / "exec"),
                 "--pidfile", str(self.state_dir / "dockerd.pid"), "--host", f"unix://{sock}", "--bridge", "none"],
                stdout=log, stderr=log, start_new_session=True,
            )
        os.environ["DOCKER_HOST"] = f"unix://{sock}"
        deadline = time.monotonic() + timeout
        while (client := docker_client()) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SandboxUnavailable(f"dockerd did not start; see {self.state_dir / 'dockerd.log'}")
            time.sleep(0.3)
        return client

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self._previous_host is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = self._previous_host
