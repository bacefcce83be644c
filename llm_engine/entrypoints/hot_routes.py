"""The standalone server's inference endpoints, answered ahead of FastAPI's whole app.

A streamed one-token /v1 completion cost the API process's event loop ~0.5 ms of CPU, and about
60% of it was FastAPI's machinery around the handler: the middleware chain, matching the path
against every route in turn, solving the route's dependencies (the API-key guard) and its
exception middleware. A burst's requests are taken in one after another on one event loop (on the
client's CPU in the overhead benchmark), so that cost is paid twelve times before the burst's
first step can start. `HotRoutes` matches the POST inference routes (`api.inference_routes`,
`kserve_http.inference_routes`: the same handlers FastAPI registers, so there is one of each) with
Starlette's own path patterns, runs the same key check and answers OpenAIError through the same
error handler; any other request, and any other method, goes on to FastAPI as before.

Stop 28 ran it as a middleware inside FastAPI's stack; since stop 32 the app calls it first
(`app.ServerApp`), so a hot request also skips FastAPI's telemetry check, Starlette's error,
body-limit and exception middleware and their wrappers: an isolated request runs each of those
layers cold (the caches emptied by whatever ran since the last request), ~0.1 ms of the way in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from starlette.requests import Request
from starlette.routing import compile_path
from starlette.types import Receive, Scope, Send

from llm_engine.entrypoints.api import InferenceRoute, openai_error_handler
from llm_engine.entrypoints.protocol import OpenAIError

Check = Callable[[Request], None]  # raises OpenAIError (401) for a caller who may not call
Handler = Callable[..., Any]


class HotRoutes:
    """POSTs to `routes` go to their handlers after `check` (`find`, then `answer`)."""

    def __init__(self, routes: Sequence[InferenceRoute], check: Check) -> None:
        self.check = check
        self.routes: list[tuple[re.Pattern[str], Handler]] = [
            (compile_path(route.path)[0], route.handler) for route in routes]

    def find(self, scope: Scope) -> tuple[Handler, dict[str, str]] | None:
        """The handler and path parameters of an inference POST; None for any other request."""
        if scope["type"] != "http" or scope["method"] != "POST":
            return None
        path, root = scope["path"], scope.get("root_path", "")
        if root and path.startswith(f"{root}/"):  # behind a prefix (uvicorn --root-path), as Starlette
            path = path[len(root):]
        for pattern, handler in self.routes:
            match = pattern.match(path)
            if match is not None:
                return handler, match.groupdict()
        return None

    async def answer(self, handler: Handler, params: dict[str, str], scope: Scope,
                     receive: Receive, send: Send) -> None:
        scope["path_params"] = params
        request = Request(scope, receive, send)
        try:
            self.check(request)
            response = await handler(request, **params)
        except OpenAIError as exc:
            response = await openai_error_handler(request, exc)
        await response(scope, receive, send)
