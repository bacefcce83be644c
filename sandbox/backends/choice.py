"""Choosing the backend (`auto`: Docker where an engine answers, else bubblewrap)."""

from __future__ import annotations

from sandbox.backend import Backend
from sandbox.backends.bwrap import BwrapBackend
from sandbox.backends.docker import DockerBackend
from sandbox.errors import SandboxUnavailable
from sandbox.limits import Limits

INSTALL_HINT = (
    "no sandbox is available to run code: install Docker (apt-get install docker.io, then start dockerd) "
    "or bubblewrap (apt-get install bubblewrap) and run the server as root; Codeyard never runs code unsandboxed"
)


def make_backend(name: str = "auto", *, pool_size: int = 0, pool_limits: Limits | None = None,
                 redis_url: str | None = None) -> Backend:
    """The backend called `name` ("auto", "docker", "bwrap", or "runners": runner nodes reached through
    Redis at redis_url), or SandboxUnavailable saying how to get one.

    pool_size/pool_limits: Docker's warm pool (idle started containers for runs with these limits)."""
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
    from sandbox.backends.remote import RemoteBackend

    if not redis_url:
        raise SandboxUnavailable("the runners sandbox backend needs Redis (set CODEYARD_REDIS_URL)")
    return RemoteBackend(connect(redis_url, REMOTE_CONNECTIONS))
