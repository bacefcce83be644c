"""Domain errors raised by services; `install_error_handlers` maps them to HTTP answers.

Services never import FastAPI: they raise these, and one handler turns each into
`{"detail": "human message"}` with the status code the class names.
"""

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


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


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(DomainError, _domain_error)
    app.add_exception_handler(RequestValidationError, _validation_error)


async def _domain_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DomainError)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers())


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    """422 with one readable sentence per problem, e.g. "body.name: String should have at most 100 characters"."""
    assert isinstance(exc, RequestValidationError)
    messages = []
    for err in exc.errors():
        where = ".".join(str(part) for part in err.get("loc", ()))
        messages.append(f"{where}: {err.get('msg', 'invalid value')}" if where else err.get("msg", "invalid"))
    return JSONResponse(
        {"detail": "; ".join(messages) or "invalid request", "errors": _plain(exc.errors())},
        status_code=422,
    )


def _plain(errors) -> list[dict]:
    """The validator's error list without the raw input/context objects (may not be JSON, may echo secrets)."""
    return [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in errors]
