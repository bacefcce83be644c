"""The KServe v2 / Triton model view of an LLMService, shared by the /v2 HTTP router and gRPC server.

The served model looks like the TensorRT-LLM backend's `ensemble`/`tensorrt_llm` models: a BYTES
`text_input` plus optional sampling tensors in, `text_output` out. Each row of a batch becomes one
/v1 CompletionRequest (so both protocols validate fields the same way, with the same 400s) and the
rows run concurrently through the same engine, batching and metrics as /v1. Tensors travel as
numpy arrays in Triton's raw layout (BYTES elements are 4-byte little-endian length prefixed),
which is what the binary tensor extension and gRPC's raw contents both carry.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

import numpy as np
from tritonclient.utils import deserialize_bytes_tensor, np_to_triton_dtype, serialize_byte_tensor, triton_to_np_dtype

from llm_engine.entrypoints.kserve_metrics import RequestStats
from llm_engine.entrypoints.protocol import CompletionRequest, OpenAIError, parse_request
from llm_engine.entrypoints.request_ids import new_request_id
from llm_engine.entrypoints.service import LLMService
from llm_engine.entrypoints.serving import _Run, _Serving

if TYPE_CHECKING:
    from llm_engine.entrypoints.ensemble import Ensemble
    from llm_engine.multimodal.inputs import ImagePrompt

try:
    SERVER_VERSION = version("codeyard")
except PackageNotFoundError:
    SERVER_VERSION = "0.0.0+source"
VERSION = "1"
EXTENSIONS = ["binary_tensor_data", "model_configuration", "generate"]


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    dims: tuple[int, ...] = (1,)  # per row, as in config.pbtxt (the batch dimension is implied)
    field: str | None = None  # the CompletionRequest field it sets


INPUTS = (
    TensorSpec("text_input", "BYTES", field="prompt"),
    TensorSpec("max_tokens", "INT32", field="max_tokens"),
    TensorSpec("min_tokens", "INT32", field="min_tokens"),
    TensorSpec("temperature", "FP32", field="temperature"),
    TensorSpec("top_p", "FP32", field="top_p"),
    TensorSpec("top_k", "INT32", field="top_k"),
    TensorSpec("repetition_penalty", "FP32", field="repetition_penalty"),
    TensorSpec("seed", "INT64", field="seed"),
    TensorSpec("stop", "BYTES", (-1,), field="stop"),
    TensorSpec("ignore_eos", "BOOL", field="ignore_eos"),
    TensorSpec("stream", "BOOL"),  # decoupled streaming: gRPC ModelStreamInfer (HTTP: generate_stream)
    TensorSpec("image_bytes_input", "BYTES", (-1,)),  # image files (JPEG/PNG/WebP/GIF) per row, infer only
)
OUTPUTS = (
    TensorSpec("text_output", "BYTES"),
    TensorSpec("finish_reason", "BYTES"),
    TensorSpec("num_output_tokens", "INT32"),
)
INPUT_BY_NAME = {spec.name: spec for spec in INPUTS}


def server_metadata() -> dict[str, Any]:
    return {"name": "codeyard-llm", "version": SERVER_VERSION, "extensions": EXTENSIONS}


def _metadata_tensor(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": [-1, *spec.dims]}


def model_metadata(service: LLMService, name: str, version: str | None = None) -> dict[str, Any]:
    ensemble = find_model(service, name, version)
    if ensemble is not None:
        return ensemble.metadata()
    return {"name": service.served_name, "versions": [VERSION], "platform": "codeyard-llm",
            "inputs": [_metadata_tensor(s) for s in INPUTS], "outputs": [_metadata_tensor(s) for s in OUTPUTS]}


CONFIG_TYPES = {"BYTES": "TYPE_STRING", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64", "FP32": "TYPE_FP32",
                 "BOOL": "TYPE_BOOL"}


def model_config(service: LLMService, name: str, version: str | None = None) -> dict[str, Any]:
    """The model's config.pbtxt as JSON (Triton's field names), filled from the engine configuration
    the way the TensorRT-LLM backend's fill_template fills it: decoupled (streaming), in-flight
    batching up to max_num_seqs, and the engine settings as string parameters."""
    ensemble = find_model(service, name, version)
    if ensemble is not None:
        return ensemble.config
    cfg = service.engine.config
    parameters = {
        "gpt_model_type": "inflight_fused_batching",
        "model_path": cfg.model,
        "dtype": cfg.dtype,
        "max_model_len": service.max_model_len() or cfg.max_model_len,
        "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "block_size": cfg.block_size,
        "kv_cache_memory": cfg.kv_cache_memory,
        "num_kv_blocks": service.engine.num_kv_blocks or cfg.num_kv_blocks,
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "batch_scheduler_policy": cfg.scheduling_policy,
        "max_queue_size": service.options.max_waiting,
    }

    def tensor(spec: TensorSpec) -> dict[str, Any]:
        return {"name": spec.name, "data_type": CONFIG_TYPES[spec.datatype], "dims": list(spec.dims),
                **({"optional": True} if spec in INPUTS and spec.name != "text_input" else {})}

    return {
        "name": service.served_name, "backend": "codeyard-llm", "max_batch_size": cfg.max_num_seqs,
        "input": [tensor(s) for s in INPUTS], "output": [tensor(s) for s in OUTPUTS],
        "model_transaction_policy": {"decoupled": True},
        "dynamic_batching": {"max_queue_delay_microseconds": "0"},
        "instance_group": [{"count": 1, "kind": "KIND_CPU" if cfg.device == "cpu" else "KIND_GPU"}],
        "parameters": {k: {"string_value": str(v)} for k, v in parameters.items() if v is not None},
    }


def find_model(service: LLMService, name: str, version: str | None) -> Ensemble | None:
    """The ensemble called `name`, or None for the served LLM itself; 404 for anything else."""
    if version not in (None, "", VERSION):
        raise OpenAIError(404, f"model `{name}` has no version {version} (only {VERSION})")
    for ensemble in service.options.ensembles:
        if ensemble.name == name:
            return ensemble
    service.check_model(name)
    return None


def request_stats(service: LLMService, name: str, version: str | None, arrived: float | None = None) -> RequestStats:
    """Triton's metrics for a request to `name`, received at `arrived` (time.time(); default now).
    An unknown model is a 404 before anything is counted, as in Triton (and no label is made for it)."""
    ensemble = find_model(service, name, version)
    return service.triton_metrics.request(service.served_name if ensemble is None else ensemble.name, arrived)


async def infer(service: LLMService, name: str, version: str | None, tensors: dict[str, np.ndarray],
                parameters: dict[str, Any] | None, stats: RequestStats | None = None) -> dict[str, np.ndarray]:
    """Output tensors of a (non-streaming) inference on the LLM or an ensemble."""
    ensemble = find_model(service, name, version)
    if ensemble is not None:
        return await ensemble.infer(service, tensors, parameters, stats)
    serving = ServingV2(service, stats)
    tensors = dict(tensors)
    images = tensors.pop("image_bytes_input", None)
    requests = requests_from_tensors(service, tensors, parameters)
    rows = len(requests)
    row_images = None if images is None else [
        [bytes(v) for v in _row("image_bytes_input", images, row, rows)] for row in range(rows)]
    return output_arrays(await serving.complete(await serving.start_rows(requests, images=row_images)))


def llm_only(service: LLMService, name: str, version: str | None) -> None:
    """Streaming and the generate extension are the LLM's (an ensemble's steps run to the end)."""
    if find_model(service, name, version) is not None:
        raise OpenAIError(400, f"`{name}` is an ensemble: use infer")


# ----- tensors ------------------------------------------------------------------------------------

def decode_raw(name: str, datatype: str, shape: list[int], raw: bytes) -> np.ndarray:
    """A tensor from Triton's raw layout (binary extension, gRPC raw_input_contents)."""
    try:
        if datatype == "BYTES":
            array: np.ndarray = deserialize_bytes_tensor(raw)
        else:
            array = np.frombuffer(raw, dtype=triton_to_np_dtype(datatype))
        return array.reshape(shape)
    except Exception as exc:  # truncated bytes, unknown type, wrong shape: all bad input
        raise OpenAIError(400, f"input '{name}': cannot read {datatype} {shape} from {len(raw)} bytes "
                               f"({type(exc).__name__})") from None


def decode_json(name: str, datatype: str, shape: list[int], data: object) -> np.ndarray:
    """A tensor from the JSON form: `data` flat or nested, row-major."""
    flat = list(_flatten(data))
    try:
        if datatype == "BYTES":
            array = np.array([x.encode() if isinstance(x, str) else bytes(x) for x in flat], dtype=object)
        else:
            array = np.array(flat, dtype=triton_to_np_dtype(datatype))
        return array.reshape(shape)
    except Exception as exc:
        raise OpenAIError(400, f"input '{name}': {len(flat)} values do not make a {datatype} tensor of shape "
                               f"{shape} ({type(exc).__name__})") from None


def _flatten(data: object) -> Iterator[Any]:  # JSON values
    if isinstance(data, list):
        for item in data:
            yield from _flatten(item)
    else:
        yield data


def datatype(array: np.ndarray) -> str:
    """The array's KServe v2 datatype (BYTES, INT32, FP32...)."""
    return str(np_to_triton_dtype(array.dtype))


def encode_raw(array: np.ndarray) -> bytes:
    return serialize_byte_tensor(array).item() if array.dtype == object else array.tobytes()


def as_json_data(array: np.ndarray) -> list[Any]:
    if array.dtype == object:
        return [x.decode("utf-8", "replace") for x in array.flatten()]
    return array.flatten().tolist()


def _python(value: np.generic | bytes) -> object:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise OpenAIError(400, "BYTES inputs must be UTF-8 text") from None
    return value.item() if isinstance(value, np.generic) else value


def request_from_values(service: LLMService, values: dict[str, object], parameters: dict[str, Any],
                        streaming: bool) -> CompletionRequest | None:
    """The request `requests_from_tensors` builds when every input is one plain value of its
    datatype (`scalar`; /v2 generate's JSON, gRPC's one-element raw tensors), without numpy arrays:
    None where the tensor path must judge (lists, other types, values out of range, unknown or
    missing inputs, images), so the answer is the tensor path's either way. `streaming`: the
    route streams whatever `stream` says; elsewhere stream=true is refused (by the tensor path)."""
    fields: dict[str, Any] = {"model": service.served_name, "n": 1}
    for name, value in values.items():
        spec = INPUT_BY_NAME.get(name)
        if spec is None:
            return None
        if name == "stream":  # no field
            if type(value) is bool and (streaming or not value):
                continue
            return None
        converted = scalar(spec.datatype, value)
        if spec.field is None or converted is NOT_SCALAR:
            return None
        fields[spec.field] = [converted] if spec.dims == (-1,) else converted
    if "prompt" not in fields:
        return None
    for name, value in parameters.items():  # request parameters fill inputs not sent
        spec = INPUT_BY_NAME.get(name)
        if spec is not None and spec.field is not None and name not in values:
            fields[spec.field] = value
    return parse_request(CompletionRequest, fields)


NOT_SCALAR = object()
_FP32 = struct.Struct("<f")
_INT_RANGES = {"INT32": (-(2 ** 31), 2 ** 31 - 1), "INT64": (-(2 ** 63), 2 ** 63 - 1)}


def scalar(datatype: str, value: object) -> object:
    """`value` as a one-element tensor of `datatype` hands it on (FP32 rounded to float32, as
    numpy does), or NOT_SCALAR where numpy's conversion must decide (it converts more, or fails)."""
    if datatype == "BYTES" and type(value) is str:
        try:
            value.encode()
        except UnicodeEncodeError:  # the tensor path answers it
            return NOT_SCALAR
        return value
    if datatype in _INT_RANGES and type(value) is int:
        low, high = _INT_RANGES[datatype]
        return value if low <= value <= high else NOT_SCALAR
    if datatype == "FP32" and (type(value) is int or type(value) is float):
        try:
            rounded: float = _FP32.unpack(_FP32.pack(value))[0]
        except OverflowError:  # numpy makes it inf
            return NOT_SCALAR
        return rounded
    if datatype == "BOOL" and type(value) is bool:
        return value
    return NOT_SCALAR


_RAW = {"INT32": struct.Struct("<i"), "INT64": struct.Struct("<q"), "FP32": _FP32}


def raw_scalar(datatype: str, raw: bytes) -> object:
    """The one value of a one-element tensor in Triton's raw layout, or NOT_SCALAR where
    `decode_raw` must judge (a length that does not fit, text that is not UTF-8, a BOOL byte
    other than 0 or 1)."""
    if datatype == "BYTES":
        if len(raw) < 4 or int.from_bytes(raw[:4], "little") != len(raw) - 4:
            return NOT_SCALAR
        try:
            return raw[4:].decode()
        except UnicodeDecodeError:
            return NOT_SCALAR
    if datatype == "BOOL":
        return raw == b"\x01" if raw in (b"\x00", b"\x01") else NOT_SCALAR
    layout = _RAW.get(datatype)
    if layout is None or len(raw) != layout.size:
        return NOT_SCALAR
    value: object = layout.unpack(raw)[0]
    return value


def requests_from_tensors(service: LLMService, tensors: dict[str, np.ndarray],
                          parameters: dict[str, Any] | None = None) -> list[CompletionRequest]:
    """One CompletionRequest per row of `text_input`; other inputs have one value per row or one
    for all. Request `parameters` with input names fill inputs that were not sent as tensors."""
    for name in tensors:
        if name not in INPUT_BY_NAME:
            raise OpenAIError(400, f"unexpected inference input '{name}' (inputs: {', '.join(INPUT_BY_NAME)})")
    if "text_input" not in tensors:
        raise OpenAIError(400, "input 'text_input' is required")
    texts = tensors["text_input"]
    rows = texts.shape[0] if texts.ndim > 1 else texts.size
    if rows < 1:
        raise OpenAIError(400, "input 'text_input' is empty")
    if "image_bytes_input" in tensors:
        raise OpenAIError(400, "image_bytes_input: images are taken by infer, not by streaming or generate")
    if tensors.get("stream") is not None and tensors["stream"].any():
        raise OpenAIError(400, "stream=true needs generate_stream or gRPC ModelStreamInfer")
    defaults = {k: v for k, v in (parameters or {}).items() if k in INPUT_BY_NAME and k not in tensors}
    requests = []
    for row in range(rows):
        body: dict[str, Any] = {"model": service.served_name, "n": 1}
        for name, array in tensors.items():
            spec = INPUT_BY_NAME[name]
            if spec.field is None:
                continue
            values = _row(name, array, row, rows)
            if values.size:
                body[spec.field] = [_python(v) for v in values] if spec.dims == (-1,) else _python(values[0])
        for name, value in defaults.items():
            if field := INPUT_BY_NAME[name].field:
                body[field] = value
        requests.append(parse_request(CompletionRequest, body))
    return requests


def _row(name: str, array: np.ndarray, row: int, rows: int) -> np.ndarray:
    """The values of `row` in an input with one row per prompt, or one row for all."""
    if array.ndim and array.shape[0] == rows:
        return array[row:row + 1].reshape(-1)
    if array.ndim == 0 or rows == 1:
        return array.reshape(-1)
    if array.shape[0] == 1:
        return array[:1].reshape(-1)
    raise OpenAIError(400, f"input '{name}' has {array.shape[0]} rows; text_input has {rows}")


def output_arrays(results: list[RowResult]) -> dict[str, np.ndarray]:
    return {"text_output": np.array([r.text.encode() for r in results], dtype=object).reshape(-1, 1),
            "finish_reason": np.array([(r.finish_reason or "").encode() for r in results],
                                      dtype=object).reshape(-1, 1),
            "num_output_tokens": np.array([r.num_tokens for r in results], dtype=np.int32).reshape(-1, 1)}


# ----- generation ---------------------------------------------------------------------------------

@dataclass
class RowResult:
    """A row's text so far (or its newest piece, when streaming), and how it ended."""

    row: int
    text: str
    finish_reason: str | None
    num_tokens: int


class ServingV2(_Serving):
    """The rows of a v2 request through the same admission, length checks and merge as /v1; with
    `stats`, the engine's timestamps of each row go to Triton's metrics."""

    def __init__(self, service: LLMService, stats: RequestStats | None = None) -> None:
        super().__init__(service)
        self.stats = stats

    async def start_rows(self, requests: list[CompletionRequest], priority: int = 0,
                         images: list[list[bytes]] | None = None, stream: bool = False) -> _Run:
        """`images`: each row's image files, one image token in its text_input per image; `stream`:
        as `_Serving.start`'s (the run may start before its first output)."""
        self.service.require_ready()
        texts = [_text_input(r) for r in requests]
        if images is None:  # the engine tokenizes the texts and checks their length (AddRequest.fit_window)
            prompts: list[str | list[int] | ImagePrompt] = list(texts)
            params = [self.sampling_params(r, r.max_tokens, None) for r in requests]
        else:  # the image tokens are expanded here, so these rows are tokenized and checked here
            rows = [await self.with_images(self.tokenize(text), row_images) for text, row_images in zip(texts, images)]
            prompts = [prompt for _, prompt in rows]
            params = [self.sampling_params(r, self.check_length(ids, r.max_tokens), None)
                      for r, (ids, _) in zip(requests, rows)]
        run = await self.start(prompts, params, priority, new_request_id("v2"), fit_window=images is None,
                               stream=stream)
        if self.stats is not None:
            self.stats.admitted(len(requests))
        return run

    async def deltas(self, run: _Run) -> AsyncIterator[RowResult]:
        """Each row's new text as the engine produces it; closing this aborts the rows still running."""
        try:
            async for row, output in run.updates:
                if output.error:
                    raise OpenAIError(500 if output.outputs and output.outputs[0].finish_reason == "error"
                                      else 400, output.error)
                if self.stats is not None:
                    self.stats.row_output(row, output.metrics, output.finished)
                part = self.new_part(run, row, output.outputs[0])
                if part is not None:
                    choice, text, tokens = part
                    yield RowResult(row, text, choice.finish_reason, tokens.stop - tokens.start)
        finally:
            await run.updates.aclose()

    async def complete(self, run: _Run) -> list[RowResult]:
        results = [RowResult(i, "", None, 0) for i in range(len(run.prompt_ids))]
        async for delta in self.deltas(run):
            result = results[delta.row]
            result.text += delta.text
            result.num_tokens += delta.num_tokens
            result.finish_reason = delta.finish_reason
        return results


def _text_input(request: CompletionRequest) -> str:
    """A row's prompt: text_input holds one text per row."""
    if not isinstance(request.prompt, str):
        raise OpenAIError(400, "input 'text_input' must hold one text per row")
    return request.prompt
