"""The /v2 router: KServe v2 REST (health, metadata, config, infer with JSON or binary tensors) and
Triton's generate extension (generate, generate_stream as SSE), next to /v1 over the same service.

Mounted by the standalone server and the IDE component with their own `auth` dependency, as /v1
is. Errors answer the protocol's `{"error": message}` with the same status codes /v1 uses
(api.openai_error_handler picks the shape by path). Leaving early cancels the request in the
engine, as on /v1.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from llm_engine.entrypoints.api import EventStream, InferenceRoute, ServiceGetter, json_body
from llm_engine.entrypoints.disconnects import unless_disconnected
from llm_engine.entrypoints.protocol import CompletionRequest, OpenAIError
from llm_engine.entrypoints.service import LLMService
from llm_engine.entrypoints.serving import _Run, sse
from llm_engine.lazy import lazy_module

if TYPE_CHECKING:
    import numpy as np

    from llm_engine.entrypoints import kserve
else:  # numpy and tritonclient come with the [llm] extra: the IDE mounts this router without them (remote LLM)
    kserve = lazy_module("llm_engine.entrypoints.kserve")

HEADER_LENGTH = "Inference-Header-Content-Length"
Handler = TypeVar("Handler", bound=Callable[..., Any])  # a route function, registered as it is


def _tensors(header: dict[str, Any], binary: bytes) -> dict[str, np.ndarray]:
    """Inputs of an infer request: JSON `data`, or `binary_data_size` bytes after the JSON header."""
    inputs = header.get("inputs")
    if not isinstance(inputs, list) or not all(isinstance(t, dict) for t in inputs):
        raise OpenAIError(400, "'inputs' must be a list of tensors")
    tensors, offset = {}, 0
    for tensor in inputs:
        name, datatype, shape = tensor.get("name"), tensor.get("datatype"), tensor.get("shape")
        if not isinstance(name, str) or not isinstance(datatype, str) or not isinstance(shape, list):
            raise OpenAIError(400, "each input needs 'name', 'datatype' and 'shape'")
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or offset + size > len(binary):
                raise OpenAIError(400, f"input '{name}': binary_data_size {size} runs past the request body")
            tensors[name] = kserve.decode_raw(name, datatype, shape, binary[offset:offset + size])
            offset += size
        elif "data" in tensor:
            tensors[name] = kserve.decode_json(name, datatype, shape, tensor["data"])
        else:
            raise OpenAIError(400, f"input '{name}' has neither 'data' nor binary_data_size")
    return tensors


def _infer_response(header: dict[str, Any], arrays: dict[str, np.ndarray], model: str) -> Response:
    """Outputs as asked: each requested one (default: all) as JSON data or appended binary."""
    wanted = header.get("outputs")
    default_binary = bool((header.get("parameters") or {}).get("binary_data_output", False))
    if wanted is None:
        wanted = [{"name": name} for name in arrays]
    outputs, blobs = [], []
    for requested in wanted:
        name = requested.get("name") if isinstance(requested, dict) else None
        if name not in arrays:
            raise OpenAIError(400, f"unexpected inference output '{name}' (outputs: {', '.join(arrays)})")
        array = arrays[name]
        out: dict[str, Any] = {"name": name, "datatype": kserve.datatype(array), "shape": list(array.shape)}
        if (requested.get("parameters") or {}).get("binary_data", default_binary):
            blob = kserve.encode_raw(array)
            out["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            out["data"] = kserve.as_json_data(array)
        outputs.append(out)
    body = {"model_name": model, "model_version": kserve.VERSION, "outputs": outputs}
    if "id" in header:
        body["id"] = header["id"]
    if not blobs:
        return JSONResponse(body)
    head = json.dumps(body).encode()
    return Response(head + b"".join(blobs), media_type="application/octet-stream",
                    headers={HEADER_LENGTH: str(len(head))})


def _generate_tensors(body: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The generate extension's JSON: inputs by name at the top level, plus optional parameters."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise OpenAIError(400, "'parameters' must be an object")
    tensors = {}
    for name, value in body.items():
        if name in ("id", "parameters"):
            continue
        spec = kserve.INPUT_BY_NAME.get(name)
        if spec is None:
            raise OpenAIError(400, f"unexpected inference input '{name}' (inputs: {', '.join(kserve.INPUT_BY_NAME)})")
        values = value if isinstance(value, list) else [value]
        tensors[name] = kserve.decode_json(name, spec.datatype, [1, len(values)] if spec.dims == (-1,) else [1],
                                           values)
    return tensors, parameters


def _generate_requests(service: LLMService, body: Any, streaming: bool) -> list[CompletionRequest]:
    """The generate extension's request: straight from its JSON when every input is one plain value
    (`_scalar_request`), else through tensors (`_generate_tensors`, `kserve.requests_from_tensors`),
    which judge everything else. `streaming`: generate_stream, which streams whatever `stream` says."""
    request = _scalar_request(service, body, streaming)
    if request is not None:
        return [request]
    tensors, parameters = _generate_tensors(body)
    if streaming:
        tensors.pop("stream", None)
    return kserve.requests_from_tensors(service, tensors, parameters)


def _scalar_request(service: LLMService, body: Any, streaming: bool) -> CompletionRequest | None:
    """The request the tensor path would build from a body of single values (the common one:
    text_input, max_tokens, temperature...), without building them into numpy arrays and back:
    that round trip was ~75 us of an isolated /v2 request's ~120 us from its bytes to the request
    (cold caches, load ~2; `json.loads` and validation the rest). None where the tensor path must
    judge (`kserve.request_from_values`)."""
    if not isinstance(body, dict):
        return None
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        return None
    values = {name: value for name, value in body.items() if name not in ("id", "parameters")}
    return kserve.request_from_values(service, values, parameters, streaming)


def _generate_body(service: LLMService, result: kserve.RowResult, request_id: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model_name": service.served_name, "model_version": kserve.VERSION, "text_output": result.text,
            "finish_reason": result.finish_reason, "num_output_tokens": result.num_tokens}
    if request_id is not None:
        body["id"] = request_id
    return body


def _model_paths(suffix: str) -> tuple[str, str]:
    """/v2/models/{name}{suffix} and /v2/models/{name}/versions/{version}{suffix}."""
    return f"/v2/models/{{model_name}}{suffix}", f"/v2/models/{{model_name}}/versions/{{version}}{suffix}"


def _model_service(get_service: ServiceGetter, request: Request, model_name: str, version: str | None) -> LLMService:
    """The service, once `model_name` is its LLM or one of its ensembles (404 otherwise)."""
    service = get_service(request)
    kserve.find_model(service, model_name, version)
    return service


def _llm_service(get_service: ServiceGetter, request: Request, model_name: str, version: str | None) -> LLMService:
    service = get_service(request)
    kserve.llm_only(service, model_name, version)
    return service


def inference_routes(get_service: ServiceGetter) -> list[InferenceRoute]:
    """POST .../infer, .../generate and .../generate_stream, each with and without a version."""

    async def infer(request: Request, model_name: str, version: str | None = None) -> Response:
        arrived = time.time()
        service = _model_service(get_service, request, model_name, version)
        raw = await request.body()
        length = request.headers.get(HEADER_LENGTH)
        try:
            split = int(length) if length is not None else len(raw)
            header = json.loads(raw[:split])
        except ValueError:
            raise OpenAIError(400, "the request header is not valid JSON") from None
        if not isinstance(header, dict):
            raise OpenAIError(400, "the request body must be a JSON object")

        async def work() -> Response:
            with kserve.request_stats(service, model_name, version, arrived) as stats:
                tensors = _tensors(header, raw[split:])
                arrays = await kserve.infer(service, model_name, version, tensors, header.get("parameters"), stats)
                return _infer_response(header, arrays, model_name)
        return await unless_disconnected(request, work())

    async def generate(request: Request, model_name: str, version: str | None = None) -> Response:
        arrived = time.time()
        service = _llm_service(get_service, request, model_name, version)
        body = await json_body(request)

        async def work() -> Response:
            with kserve.request_stats(service, model_name, version, arrived) as stats:
                serving = kserve.ServingV2(service, stats)
                [result] = await serving.complete(
                    await serving.start_rows(_generate_requests(service, body, streaming=False)))
                return JSONResponse(_generate_body(service, result, body.get("id")))
        return await unless_disconnected(request, work())

    async def generate_stream(request: Request, model_name: str, version: str | None = None) -> Response:
        arrived = time.time()
        service = _llm_service(get_service, request, model_name, version)
        body = await json_body(request)
        stats = kserve.request_stats(service, model_name, version, arrived)
        serving = kserve.ServingV2(service, stats)

        async def start() -> _Run:
            try:
                return await serving.start_rows(_generate_requests(service, body, streaming=True), stream=True)
            except BaseException as exc:  # refused, bad input, or the client left while it waited
                stats.failed(exc)
                raise

        async def events(run: _Run) -> AsyncIterator[bytes]:
            with stats:  # a success once the last event is out; cancelled if the client leaves
                try:
                    async for delta in serving.deltas(run):
                        yield sse(_generate_body(service, delta, body.get("id")))
                except OpenAIError as exc:
                    stats.failed(exc)
                    yield sse({"error": exc.message})

        run = await unless_disconnected(request, start())
        if isinstance(run, Response):
            return run
        return EventStream(events(run))

    return [InferenceRoute(path, handler, ())  # the router's own tag
            for suffix, handler in (("/infer", infer), ("/generate", generate), ("/generate_stream", generate_stream))
            for path in _model_paths(suffix)]


def build_router(get_service: ServiceGetter, auth: Any, health_dependencies: list[Any] | None = None) -> APIRouter:
    """`auth` guards every model route; health routes take `health_dependencies` (none on the
    standalone server, so Kubernetes probes need no key, as its /health)."""
    router = APIRouter(tags=["kserve-v2"])
    health = health_dependencies if health_dependencies is not None else [auth]

    def model_route(method: str, suffix: str) -> Callable[[Handler], Handler]:
        """Register a handler at /v2/models/{name}{suffix} and /v2/models/{name}/versions/{version}{suffix}."""
        def register(handler: Handler) -> Handler:
            for path in _model_paths(suffix):
                router.add_api_route(path, handler, methods=[method], dependencies=[auth])
            return handler
        return register

    @router.get("/v2", dependencies=[auth])
    def server_metadata() -> dict[str, Any]:
        return kserve.server_metadata()

    @router.get("/v2/health/live", dependencies=health)
    def live() -> dict[str, Any]:
        return {}

    @router.get("/v2/health/ready", dependencies=health)
    def ready(request: Request) -> dict[str, Any]:
        get_service(request).require_ready()
        return {}

    @model_route("GET", "")
    def metadata(request: Request, model_name: str, version: str | None = None) -> dict[str, Any]:
        return kserve.model_metadata(get_service(request), model_name, version)

    @model_route("GET", "/ready")
    def model_ready(request: Request, model_name: str, version: str | None = None) -> dict[str, Any]:
        _model_service(get_service, request, model_name, version).require_ready()
        return {}

    @model_route("GET", "/config")
    def config(request: Request, model_name: str, version: str | None = None) -> dict[str, Any]:
        return kserve.model_config(get_service(request), model_name, version)

    for route in inference_routes(get_service):
        route.add_to(router, auth)
    return router
