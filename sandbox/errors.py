"""The sandbox's domain errors; the API's one error handler maps them to HTTP statuses."""

from __future__ import annotations

from ide_server.errors import DomainError, NotFound, Throttled


class SandboxUnavailable(DomainError):
    """No backend can run code safely on this host; the message says how to fix that."""

    status_code = 503


class QueueFull(Throttled):
    """Too many runs are waiting (for everyone, or for this user)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail, retry_after=5)


class RunNotFound(NotFound):
    pass
