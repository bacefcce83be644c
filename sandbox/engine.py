"""Finding a Docker engine, and choosing the backend (`auto`: Docker where an engine answers, else bubblewrap)."""

from __future__ import annotations

from sandbox.backend import Backend
from sandbox.workspace import SandboxUnavailable

INSTALL_HINT = (
    "no sandbox is available to run code: install Docker (apt-get install docker.io, then start dockerd) "
    "or bubblewrap (apt-get install bubblewrap) and run the server as root; Codeyard never runs code unsandboxed"
)


def docker_client(timeout: int = 60):
    """A client for the engine named by DOCKER_HOST (or the default socket), or None if none answers."""
    import docker
    import docker.errors

    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
        return client
    except (docker.errors.DockerException, OSError):
        return None


def make_backend(name: str = "auto") -> Backend:
    """The backend called `name` ("auto", "docker" or "bwrap"), or SandboxUnavailable saying how to get one."""
    from sandbox.bwrap import BwrapBackend
    from sandbox.docker_backend import DockerBackend

    if name not in ("auto", "docker", "bwrap"):
        raise ValueError(f"sandbox backend must be auto, docker or bwrap, not {name!r}")
    reasons = []
    for cls in (DockerBackend, BwrapBackend):
        if name not in ("auto", cls.name):
            continue
        reason = cls.unavailable_reason()
        if reason is None:
            return cls()
        reasons.append(f"{cls.name}: {reason}")
    raise SandboxUnavailable(f"{INSTALL_HINT} ({'; '.join(reasons)})")
