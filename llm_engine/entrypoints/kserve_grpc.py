"""The KServe v2 GRPCInferenceService (Triton's gRPC API) over an LLMService, on its own port.

Served with grpc.aio on the HTTP server's event loop, from the protos tritonclient ships (so
tritonclient.grpc and this server can never disagree). ModelStreamInfer is Triton's decoupled
streaming: with the `stream` input true, one response per new piece of text, the last carrying
`triton_final_response`. Callers are checked on `authorization` metadata (not for
ServerLive/ServerReady, as HTTP health) by an `Authorize` function: the standalone server's API
keys (`api_key_check`), or the IDE's personal API tokens. The service comes from a getter, so the
IDE can hand over its LLM that loads on first use. A cancelled call (client gone, stream stopped)
aborts its engine requests.
"""

from __future__ import annotations

import asyncio
import hmac
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import np_to_triton_dtype

from llm_engine.entrypoints import kserve
from llm_engine.entrypoints.protocol import OpenAIError
from llm_engine.entrypoints.service import LLMService, as_openai_error

Authorize = Callable[[str], Awaitable[bool]]  # the `authorization` metadata ("" when absent) -> let in?
ServiceGetter = Callable[[], LLMService]  # raises OpenAIError when there is none (switched off, not loadable)

_STATUS = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
           404: grpc.StatusCode.NOT_FOUND, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
           503: grpc.StatusCode.UNAVAILABLE}
_CONTENTS = {"BYTES": "bytes_contents", "INT32": "int_contents", "INT64": "int64_contents",
             "FP32": "fp32_contents", "BOOL": "bool_contents"}


def _tensors(request: pb.ModelInferRequest) -> dict[str, np.ndarray]:
    """Inputs from raw_input_contents (what tritonclient sends) or the typed `contents` fields."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise OpenAIError(400, f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs")
    tensors = {}
    for i, tensor in enumerate(request.inputs):
        shape = list(tensor.shape)
        if raw:
            tensors[tensor.name] = kserve.decode_raw(tensor.name, tensor.datatype, shape, raw[i])
        elif tensor.datatype in _CONTENTS:
            values = list(getattr(tensor.contents, _CONTENTS[tensor.datatype]))
            tensors[tensor.name] = kserve.decode_json(tensor.name, tensor.datatype, shape, values)
        else:
            raise OpenAIError(400, f"input '{tensor.name}': datatype {tensor.datatype} is not supported")
    return tensors


def _raw_values(request: pb.ModelInferRequest) -> dict[str, object] | None:
    """Each input's one value, read from raw_input_contents (what tritonclient sends) without numpy
    (`kserve.raw_scalar`), when every input is a one-element tensor of its spec's datatype; else
    None, and `_tensors` reads them. The numpy round trip was the larger part of a gRPC request's
    way from its message to `generate` (0.41-0.43 ms, cold caches)."""
    raw = request.raw_input_contents
    if len(raw) != len(request.inputs):
        return None
    values: dict[str, object] = {}
    for tensor, data in zip(request.inputs, raw):
        spec = kserve.INPUT_BY_NAME.get(tensor.name)
        if spec is None or tensor.datatype != spec.datatype or list(tensor.shape) not in ([1, 1], [1]):
            return None
        value = kserve.raw_scalar(spec.datatype, data)
        if value is kserve.NOT_SCALAR:
            return None
        values[tensor.name] = value
    return values


def _parameters(params: Any) -> dict[str, Any]:  # a protobuf map of InferParameter
    return {key: getattr(value, value.WhichOneof("parameter_choice")) for key, value in params.items()
            if value.WhichOneof("parameter_choice")}


Output = tuple[str, list[int], bytes]  # datatype, shape, raw contents


def raw_outputs(arrays: dict[str, np.ndarray]) -> dict[str, Output]:
    return {name: (np_to_triton_dtype(a.dtype), list(a.shape), kserve.encode_raw(a)) for name, a in arrays.items()}


def delta_outputs(delta: kserve.RowResult) -> dict[str, Output]:
    """A streamed piece's [1, 1] tensors (those of kserve.output_arrays), packed directly: numpy
    arrays and tritonclient's serializer took about 10x a /v1 chunk's whole encoding, per token."""
    def element(value: str) -> bytes:  # a BYTES element: its length (uint32 LE), then its bytes
        data = value.encode()
        return struct.pack("<I", len(data)) + data

    return {"text_output": ("BYTES", [1, 1], element(delta.text)),
            "finish_reason": ("BYTES", [1, 1], element(delta.finish_reason or "")),
            "num_output_tokens": ("INT32", [1, 1], struct.pack("<i", delta.num_tokens))}


def _response(request: pb.ModelInferRequest, outputs: dict[str, Output],
              final: bool | None = None) -> pb.ModelInferResponse:
    names = [o.name for o in request.outputs] or list(outputs)
    response = pb.ModelInferResponse(model_name=request.model_name, model_version=kserve.VERSION, id=request.id)
    for name in names:
        if name not in outputs:
            raise OpenAIError(400, f"unexpected inference output '{name}' (outputs: {', '.join(outputs)})")
        datatype, shape, raw = outputs[name]
        response.outputs.add(name=name, datatype=datatype, shape=shape)
        response.raw_output_contents.append(raw)
    if final is not None:
        response.parameters["triton_final_response"].bool_param = final
    return response


def _piece_template(request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    """What every streamed piece of `request` copies: the outputs it asks for (400 for one that is
    not there, before anything runs) with their datatypes and shapes, and no contents yet."""
    template = _response(request, delta_outputs(kserve.RowResult(0, "", None, 0)))
    del template.raw_output_contents[:]
    return template


def _piece(template: pb.ModelInferResponse, delta: kserve.RowResult) -> pb.ModelStreamInferResponse:
    """A streamed delta: a copy of the request's response template (its outputs' names, types and
    shapes, which _response checked once) with the delta's contents. Building each piece through
    _response cost about three times as much, per token."""
    raw = delta_outputs(delta)
    response = pb.ModelInferResponse()
    response.CopyFrom(template)
    response.raw_output_contents.extend([raw[output.name][2] for output in template.outputs])
    response.parameters["triton_final_response"].bool_param = delta.finish_reason is not None
    return pb.ModelStreamInferResponse(infer_response=response)


def api_key_check(keys: frozenset[str]) -> Authorize:
    """With API keys configured, every call needs `authorization: Bearer <one of them>`."""
    async def authorize(authorization: str) -> bool:
        scheme, _, token = authorization.partition(" ")
        return not keys or (scheme.lower() == "bearer" and any(hmac.compare_digest(token.strip(), k) for k in keys))
    return authorize


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]  # generated, untyped
    def __init__(self, get_service: ServiceGetter, authorize: Authorize) -> None:
        self.get_service = get_service
        self.authorize = authorize

    async def _admit(self, context: grpc.aio.ServicerContext) -> None:
        if not await self.authorize(dict(context.invocation_metadata()).get("authorization", "")):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "missing or invalid API key (send authorization: Bearer <key>)")

    async def _service(self, context: grpc.aio.ServicerContext) -> LLMService:
        """The caller's service, once let in."""
        await self._admit(context)
        try:
            return self.get_service()
        except OpenAIError as exc:
            await _abort(context, exc)
            raise

    async def _model(self, context: grpc.aio.ServicerContext, name: str, version: str) -> LLMService:
        service = await self._service(context)
        try:
            kserve.find_model(service, name, version)
        except OpenAIError as exc:
            await _abort(context, exc)
        return service

    async def ServerLive(self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext) -> pb.ServerLiveResponse:  # health needs no key, as on HTTP (probes)
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext) -> pb.ServerReadyResponse:
        try:
            return pb.ServerReadyResponse(ready=self.get_service().engine.is_ready)
        except OpenAIError:  # no model here (switched off, or not loadable)
            return pb.ServerReadyResponse(ready=False)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext) -> pb.ModelReadyResponse:
        service = await self._service(context)
        try:
            kserve.find_model(service, request.name, request.version)
        except OpenAIError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=service.engine.is_ready)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext) -> pb.ServerMetadataResponse:
        await self._service(context)
        return json_format.ParseDict(kserve.server_metadata(), pb.ServerMetadataResponse())

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext) -> pb.ModelMetadataResponse:
        service = await self._model(context, request.name, request.version)
        return json_format.ParseDict(kserve.model_metadata(service, request.name, request.version), pb.ModelMetadataResponse())

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext) -> pb.ModelConfigResponse:
        service = await self._model(context, request.name, request.version)
        config = json_format.ParseDict(kserve.model_config(service, request.name, request.version), model_config_pb2.ModelConfig())
        return pb.ModelConfigResponse(config=config)

    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
        arrived = time.time()
        service = await self._model(context, request.model_name, request.model_version)
        try:
            with service.engine.admission(), kserve.request_stats(service, request.model_name,
                                                                    request.model_version, arrived) as stats:
                await service.engine.wait_for_burst()
                tensors = _tensors(request)
                stream = tensors.get("stream")
                if stream is not None and stream.any():
                    raise OpenAIError(400, "stream=true needs ModelStreamInfer")
                arrays = await kserve.infer(service, request.model_name, request.model_version, tensors,
                                            _parameters(request.parameters), stats)
                return _response(request, raw_outputs(arrays))
        except Exception as exc:
            await _abort(context, as_openai_error(exc))

    async def _stream_one(self, service: LLMService,
                          request: pb.ModelInferRequest) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """The responses to one request on a stream: deltas when it asks to stream, else one."""
        try:
            with kserve.request_stats(service, request.model_name, request.model_version) as stats:
                values = _raw_values(request)
                if values is not None and values.get("stream") is True:  # most streams: no tensors
                    kserve.llm_only(service, request.model_name, request.model_version)
                    single = kserve.request_from_values(service, values, _parameters(request.parameters), True)
                else:
                    single = None
                if single is not None:
                    requests = [single]
                else:
                    tensors = _tensors(request)
                    stream = tensors.pop("stream", None)
                    if stream is None or not stream.any():
                        arrays = await kserve.infer(service, request.model_name, request.model_version, tensors,
                                                    _parameters(request.parameters), stats)
                        yield pb.ModelStreamInferResponse(infer_response=_response(request, raw_outputs(arrays), True))
                        return
                    kserve.llm_only(service, request.model_name, request.model_version)
                    requests = kserve.requests_from_tensors(service, tensors, _parameters(request.parameters))
                if len(requests) != 1:
                    raise OpenAIError(400, "streaming takes one prompt per request")
                template = _piece_template(request)
                serving = kserve.ServingV2(service, stats)
                async for delta in serving.deltas(await serving.start_rows(requests)):
                    yield _piece(template, delta)
        except Exception as exc:
            yield pb.ModelStreamInferResponse(error_message=as_openai_error(exc).message)

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[pb.ModelInferRequest],
                               context: grpc.aio.ServicerContext) -> None:
        """Requests on one stream run concurrently; their responses interleave as they come. Each
        request's task writes its own responses (`context.write`, one at a time under a lock): a
        response goes out from the task that made it, without a queue and a second task (the
        handler as a generator) woken to yield it, one loop pass less on each piece's way out."""
        service = await self._service(context)
        writing = asyncio.Lock()
        tasks: set[asyncio.Task[None]] = set()

        async def serve(request: pb.ModelInferRequest) -> None:
            with service.engine.admission():
                await service.engine.wait_for_burst()
                async for response in self._stream_one(service, request):
                    async with writing:
                        await context.write(response)

        try:
            async for request in request_iterator:
                task = asyncio.ensure_future(serve(request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:  # the client has sent its last request; its responses are still going out
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _abort(context: grpc.aio.ServicerContext, exc: OpenAIError) -> None:
    await context.abort(_STATUS.get(exc.status, grpc.StatusCode.INTERNAL), exc.message)


async def start_server(get_service: ServiceGetter, authorize: Authorize, address: str) -> tuple[grpc.aio.Server, int]:
    """Listen on `address` (host:port; port 0: any free one) and serve; returns the server and the
    port it listens on. Stop with `await server.stop(grace)`."""
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(get_service, authorize), server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen for gRPC on {address}")
    await server.start()
    return server, port
