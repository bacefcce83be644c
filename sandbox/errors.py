"""The sandbox's errors, free of the IDE: each names the HTTP status the IDE answers with
(`sandbox/api.py` hands them to the IDE's error handler, like its own domain errors)."""

from __future__ import annotations


class SandboxError(Exception):
    """Base class; `status_code` and `headers()` shape the IDE's answer, `detail` is the message."""

    status_code = 500

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    def headers(self) -> dict[str, str]:
        return {}


class SandboxUnavailable(SandboxError):
    """No backend can run code safely on this host; the message says how to fix that."""

    status_code = 503


class QueueFull(SandboxError):
    """Too many runs are waiting (for everyone, or for this user)."""

    status_code = 429
    retry_after = 5

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class RunNotFound(SandboxError):
    status_code = 404
