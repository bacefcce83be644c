"""The /v1 router (models, completions, chat completions) and /metrics, over one LLMService.

`build_router(get_service, auth)` is shared by the standalone server and the IDE component: they
differ only in how callers are authenticated (API keys vs. IDE users) and where the service lives.
Bodies are parsed here rather than by FastAPI, so that bad input answers OpenAI's 400 error
object instead of FastAPI's 422.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from llm_engine.entrypoints.disconnects import unless_disconnected
from llm_engine.entrypoints.protocol import ChatCompletionRequest, CompletionRequest, OpenAIError, parse_request
from llm_engine.entrypoints.service import LLMService
from llm_engine.entrypoints.serving import ServingChat, ServingCompletion
from llm_engine.metrics import CONTENT_TYPE

ServiceGetter = Callable[[Request], LLMService]


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = _inlined(model.model_json_schema())
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with its `$defs` written in place. Placed in the OpenAPI document, its local
    "#/$defs/..." references would resolve against the whole document and point nowhere (Swagger
    UI and openapi-typescript fail on them); a discriminator's mapping names such references too,
    so it goes (the `oneOf` it sits beside still lists every variant)."""
    definitions = schema.pop("$defs", {})

    def expand(node: Any) -> Any:
        if isinstance(node, list):
            return [expand(item) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref", "")
        if ref.startswith("#/$defs/"):
            return expand({**definitions[ref.removeprefix("#/$defs/")], **{k: v for k, v in node.items() if k != "$ref"}})
        return {key: {k: v for k, v in value.items() if k != "mapping"} if key == "discriminator" else expand(value)
                for key, value in node.items()}

    expanded: dict[str, Any] = expand(schema)
    return expanded


async def json_body(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError:
        raise OpenAIError(400, "the request body is not valid JSON") from None


class EventStream(Response):
    """Server-sent events from `events`, stopped (and so its engine requests aborted) when the
    client disconnects. Starlette's StreamingResponse does the same with an anyio task group per
    response (its stream in one task, the watch for the disconnect in another, a cancel scope
    over both): ~30% of the event loop's CPU for a one-token /v1 request, paid one request after
    another while a burst's first tokens go out. Here the stream runs in the request's own task,
    and one plain task waits for the disconnect and cancels it."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes]) -> None:
        self.events = events
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        host = asyncio.current_task()
        assert host is not None
        state = {"streaming": True, "gone": False}

        def on_message(watch: asyncio.Future[None]) -> None:
            if state["streaming"] and not watch.cancelled() and watch.exception() is None:
                state["gone"] = True
                host.cancel()

        watch = asyncio.ensure_future(_disconnected(receive))
        watch.add_done_callback(on_message)
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in self.events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not state["gone"]:
                raise
            host.uncancel()  # the client left: the stream ends here, as StreamingResponse's does
        finally:
            state["streaming"] = False
            watch.cancel()
            aclose = getattr(self.events, "aclose", None)
            if aclose is not None:
                await aclose()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def answer(result: dict[str, Any] | AsyncIterator[bytes] | Response) -> Response:
    if isinstance(result, Response):  # the client went away (499)
        return result
    if isinstance(result, dict):
        return JSONResponse(result)
    return EventStream(result)


@dataclass(frozen=True)
class InferenceRoute:
    """An inference endpoint: FastAPI registers it (`add_to`, behind the router's auth dependency),
    and the standalone server also answers it ahead of FastAPI's router (`hot_routes.HotRoutes`)
    with the same handler. `handler(request, **path parameters)`, path parameters as in `path`."""

    path: str  # a Starlette path template
    handler: Callable[..., Awaitable[Response]]
    tags: tuple[str, ...]
    openapi_extra: dict[str, Any] | None = field(default=None, compare=False)

    def add_to(self, router: APIRouter, auth: Any) -> None:
        router.add_api_route(self.path, self.handler, methods=["POST"], dependencies=[auth],
                             tags=list(self.tags) or None, openapi_extra=self.openapi_extra)


def inference_routes(get_service: ServiceGetter) -> list[InferenceRoute]:
    """POST /v1/completions and /v1/chat/completions."""

    async def completions(request: Request) -> Response:
        req = parse_request(CompletionRequest, await json_body(request))
        service = get_service(request)
        return answer(await unless_disconnected(request, ServingCompletion(service).create(req)))

    async def chat_completions(request: Request) -> Response:
        req = parse_request(ChatCompletionRequest, await json_body(request))
        service = get_service(request)
        return answer(await unless_disconnected(request, ServingChat(service).create(req)))

    return [InferenceRoute("/v1/completions", completions, ("llm",), _body_schema(CompletionRequest)),
            InferenceRoute("/v1/chat/completions", chat_completions, ("llm",), _body_schema(ChatCompletionRequest))]


def build_router(get_service: ServiceGetter, auth: Any, metrics_path: str = "/metrics") -> APIRouter:
    """`auth`: a dependency (Depends(...)) that every route, metrics included, runs first."""
    router = APIRouter()

    @router.get("/v1/models", dependencies=[auth], tags=["llm"])
    def list_models(request: Request) -> dict[str, Any]:
        service = get_service(request)
        return {"object": "list", "data": [{
            "id": service.served_name, "object": "model", "created": int(service.started_at),
            "owned_by": "codeyard", "root": service.model_path, "max_model_len": service.max_model_len(),
            "ready": service.engine.is_ready}]}

    for route in inference_routes(get_service):
        route.add_to(router, auth)

    @router.get(metrics_path, dependencies=[auth], tags=["llm"])
    def metrics(request: Request) -> Response:
        return Response(get_service(request).metrics.render(), media_type=CONTENT_TYPE)

    return router


async def openai_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """OpenAI's error object, or under /v2 the KServe one (`{"error": message}`), same status."""
    assert isinstance(exc, OpenAIError)
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
    body = {"error": exc.message} if request.url.path.startswith("/v2") else exc.body()
    return JSONResponse(body, status_code=exc.status, headers=headers)


def install(app: FastAPI) -> None:
    """Answer OpenAIError with its error object (the one handler /v1 and /v2 need)."""
    app.add_exception_handler(OpenAIError, openai_error_handler)


def service_from_state(request: Request) -> LLMService:
    service: LLMService = request.app.state.llm
    return service

