"""Finding a Docker engine (DOCKER_HOST or the default socket), or starting one of our own."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from sandbox.errors import SandboxUnavailable


def docker_client(timeout: int = 60) -> Any:  # a docker.DockerClient (the library ships no types) or None
    """A client for the engine named by DOCKER_HOST (or the default socket), or None if none answers."""
    import docker.errors

    import docker

    try:
        # one HTTP connection per concurrent API call (the Docker backend's thread pool has 64)
        # mypy takes `docker` for the repository's docker/ folder (the compose files): hence the ignore
        client = docker.from_env(timeout=timeout, max_pool_size=64)  # type: ignore[attr-defined]
        client.ping()
        return client
    except (docker.errors.DockerException, OSError):
        return None


class LocalDockerd:
    """A dockerd of our own (own socket, data-root, pidfile under state_dir), for tests and benchmarks."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir.resolve()  # dockerd needs absolute socket paths
        self.proc: subprocess.Popen[bytes] | None = None
        self._previous_host = os.environ.get("DOCKER_HOST")

    def start(self, timeout: float = 60) -> Any:
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
