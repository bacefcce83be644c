"""Structured logs: one JSON object per line on stderr, and one line per HTTP request.

Request lines carry method, path, route, status and duration. Never logged: headers, cookies,
the query string, and path parameters named in SECRET_PATH_PARAMS (invite tokens), which are
masked in the path.
"""

import logging
import sys
import time

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from structlog.typing import FilteringBoundLogger, Processor

SECRET_PATH_PARAMS = frozenset({"token"})
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(level: str = "info") -> None:
    """JSON lines on stderr, for structlog loggers and stdlib ones (uvicorn, alembic) alike."""
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])
    for noisy in ("alembic", "httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> FilteringBoundLogger:
    logger: FilteringBoundLogger = structlog.get_logger(name)
    return logger


class RequestLogMiddleware:
    """Pure ASGI middleware (works for streaming responses and WebSockets alike)."""

    def __init__(self, app: ASGIApp):
        self.app = app
        self.log = get_logger("codeyard.request")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 0

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] in ("http.response.start", "websocket.http.response.start"):
                status = message["status"]
            elif message["type"] == "websocket.accept":
                status = 101
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        except Exception:
            status = 500
            raise
        finally:
            route = scope.get("route")
            self.log.info(
                "request",
                method=scope.get("method", "WS"),
                path=_masked_path(scope),
                route=getattr(route, "path", None),
                status=status,
                duration_ms=round((time.perf_counter() - start) * 1000, 2),
            )


def _masked_path(scope: Scope) -> str:
    path: str = scope["path"]
    for name, value in (scope.get("path_params") or {}).items():
        if name in SECRET_PATH_PARAMS and isinstance(value, str) and value:
            path = path.replace(value, "***")
    return path
