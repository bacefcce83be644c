"""The standalone server (`codeyard llm serve`): /v1 (OpenAI), /v2 (KServe v2 / Triton), /metrics, /health."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import Depends, FastAPI, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from llm_engine.config import EngineConfig
from llm_engine.entrypoints import api, kserve_http
from llm_engine.entrypoints.hot_routes import HotRoutes
from llm_engine.entrypoints.protocol import OpenAIError
from llm_engine.entrypoints.service import LLMService, ServerOptions


async def _api_key_guard(request: Request) -> None:
    """Async so that FastAPI runs it on the event loop: as a plain function it went to a worker
    thread on every /v1 and /v2 request (a thread hand-off, ~23% of the loop's Python per request)."""
    check_bearer(request, request.app.state.llm.options.api_keys)


def check_bearer(request: Request, keys: frozenset[str]) -> None:
    """With API keys configured, every call needs `Authorization: Bearer <one of them>`."""
    if not keys:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not any(hmac.compare_digest(token.strip(), k) for k in keys):
        raise OpenAIError(401, "missing or invalid API key (send Authorization: Bearer <key>)",
                          code="invalid_api_key")


class CountAdmissions:
    """Counts each POST (an inference request: /v1 and /v2 take no other) as on its way to the engine
    from the moment it arrives, before its body is read and parsed (`RequestStreams.admission`), and
    lets a request that comes alone wait a moment for the rest of a burst (`wait_for_burst`)."""

    def __init__(self, app: ASGIApp, service: LLMService) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        await admitted(self.service, self.app, scope, receive, send)


async def admitted(service: LLMService, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """`app` answers the request, counted as on its way to the engine from here (`admission`), after
    the moment a request alone waits for the rest of a burst (`wait_for_burst`)."""
    with service.engine.admission():
        await service.engine.wait_for_burst()
        await app(scope, receive, send)


class ServerApp(FastAPI):
    """FastAPI with the inference POSTs (`hot`) answered before any of FastAPI's own layers: counted
    (`admitted`), the key checked, the route's handler (`HotRoutes.answer`); every other request, other
    POSTs too (through `CountAdmissions`), goes through FastAPI's middleware, routing and dependencies.
    An isolated request ran FastAPI's telemetry check, Starlette's error, body-limit and exception
    middleware and its own wrappers cold before it reached `HotRoutes`; as a middleware inside them
    (stop 28), the hot path saved only FastAPI's routing and dependencies."""

    hot: HotRoutes | None = None
    service: LLMService | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.hot is not None and self.service is not None:
            found = self.hot.find(scope)
            if found is not None:
                scope["app"] = self  # as Starlette sets it: the handlers find the service in its state
                await admitted(self.service, partial(self.hot.answer, *found), scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(config: EngineConfig, served_name: str, options: ServerOptions | None = None) -> FastAPI:
    """The app loads the model in the background when it starts; /v1 answers 503 until then."""
    return app_for(LLMService(config, served_name, options))


def app_for(service: LLMService, own_service: bool = True, hot_routes: bool = True) -> FastAPI:
    """The server over `service`; when it owns the service, it starts and stops it with the app
    (else it serves one that runs already, e.g. a model loaded once for several servers).
    `hot_routes`: answer the inference POSTs ahead of FastAPI's router (`HotRoutes`; False: all
    through FastAPI, as the benchmark of their cost compares)."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if own_service:  # this loop reads the engine core's outputs (no reader thread in between)
            service.start(asyncio.get_running_loop())
        grpc_server = None
        if service.options.grpc_address:  # on this event loop, so both protocols share the engine's
            from llm_engine.entrypoints.kserve_grpc import api_key_check, start_server
            grpc_server, _ = await start_server(lambda: service, api_key_check(service.options.api_keys),
                                                service.options.grpc_address)
        try:
            yield
        finally:
            if grpc_server is not None:
                await grpc_server.stop(1.0)
            if own_service:
                service.stop()

    app = ServerApp(title="Codeyard LLM server", lifespan=lifespan)
    if hot_routes:  # answered ahead of FastAPI's layers (ServerApp.__call__)
        app.hot = HotRoutes(check=lambda request: check_bearer(request, service.options.api_keys),
                            routes=[*api.inference_routes(api.service_from_state),
                                    *kserve_http.inference_routes(api.service_from_state)])
        app.service = service
    app.add_middleware(CountAdmissions, service=service)  # the POSTs that go through FastAPI
    app.state.llm = service
    api.install(app)
    guard = Depends(_api_key_guard)
    app.include_router(api.build_router(api.service_from_state, guard))
    app.include_router(kserve_http.build_router(api.service_from_state, guard, health_dependencies=[]))

    @app.get("/health")
    def health() -> dict[str, Any]:
        """200 once the model is loaded (503 before), for load balancers and compose health checks."""
        service.require_ready()
        return {"status": "ok"}

    return app
