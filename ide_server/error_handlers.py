"""The one place that turns errors into HTTP answers: `{"detail": "human message"}`."""

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from ide_server.errors import DomainError

BUSY_RETRY_AFTER_S = 2


class StatusError(Protocol):
    """What the handler reads from an error: DomainError's shape, which other packages' errors share."""

    status_code: int
    detail: str

    def headers(self) -> dict[str, str]: ...


class ErrorBody(BaseModel):
    detail: str


# Give this to an APIRouter (`responses=ERROR_RESPONSES`) so its OpenAPI lists the error answers.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        400: "Invalid input",
        401: "Not signed in, or a bad API token",
        403: "Signed in, but not allowed (role, CSRF token)",
        404: "No such thing, or not visible to you",
        409: "Conflicts with the current state",
        413: "Too large",
        429: "Too many attempts; see Retry-After",
        503: "Busy or not ready; see Retry-After",
    }.items()
}


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(DomainError, _domain_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(PoolTimeout, _busy)
    app.add_exception_handler(OperationalError, _busy)
    _document_validation_errors(app)


def answer_like_domain_errors(app: FastAPI, error_type: type[Exception]) -> None:
    """Answer another package's errors (e.g. the sandbox's, which know nothing of the IDE) as DomainErrors."""
    app.add_exception_handler(error_type, _domain_error)


def _document_validation_errors(app: FastAPI) -> None:
    """Make the OpenAPI document describe the 422 body this handler really sends."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()
        schemas = schema.get("components", {}).get("schemas", {})
        if "HTTPValidationError" in schemas:
            schemas["HTTPValidationError"] = {
                "title": "HTTPValidationError",
                "type": "object",
                "required": ["detail"],
                "properties": {
                    "detail": {"type": "string", "description": "All problems, as one readable sentence."},
                    "errors": {"type": "array", "items": {"$ref": "#/components/schemas/ValidationError"}},
                },
            }
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


async def _domain_error(_request: Request, exc: Exception) -> JSONResponse:
    error = cast(StatusError, exc)
    return JSONResponse({"detail": error.detail}, status_code=error.status_code, headers=error.headers())


def _database_unavailable(exc: OperationalError) -> bool:
    """SQLite's write lock held past the wait, or PostgreSQL out of reach: refused, restarting
    ("the database system is starting up", SQLSTATE 57P03), shutting down (57P0x) or a dropped
    connection (class 08). What a client should retry, not a bug."""
    if "database is locked" in str(exc.orig) or exc.connection_invalidated:
        return True
    if not type(exc.orig).__module__.startswith("psycopg"):
        return False
    sqlstate = getattr(exc.orig, "sqlstate", None)
    return sqlstate is None or sqlstate.startswith(("08", "57P"))


async def _busy(_request: Request, exc: Exception) -> JSONResponse:
    """Back-pressure: no database connection within the wait, SQLite's write lock or a database
    being restarted is a 503 the client retries, not a hang or a 500. Other operational errors
    stay 500s."""
    if isinstance(exc, OperationalError) and not _database_unavailable(exc):
        raise exc
    return JSONResponse({"detail": "the server is busy; try again in a moment"}, status_code=503,
                        headers={"Retry-After": str(BUSY_RETRY_AFTER_S)})


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


def _plain(errors: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The validator's error list without the raw input/context objects (may not be JSON, may echo secrets)."""
    return [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in errors]
