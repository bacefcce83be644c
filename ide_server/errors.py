"""Domain errors raised by services (and the CLI), independent of HTTP.

Services never import FastAPI: they raise these, and one handler (`error_handlers.py`) turns
each into `{"detail": "human message"}` with the status code the class names.
"""


class DomainError(Exception):
    """Base class; `status_code` is the HTTP status the handler answers with."""

    status_code = 400

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail

    def headers(self) -> dict[str, str]:
        return {}


class InvalidInput(DomainError):
    status_code = 400


class NotAuthenticated(DomainError):
    status_code = 401

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class PermissionDenied(DomainError):
    status_code = 403


class NotFound(DomainError):
    status_code = 404


class Conflict(DomainError):
    status_code = 409


class TooLarge(DomainError):
    status_code = 413


class Throttled(DomainError):
    status_code = 429

    def __init__(self, detail: str, retry_after: int):
        super().__init__(detail)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}
