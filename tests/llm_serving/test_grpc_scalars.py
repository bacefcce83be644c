"""gRPC's ModelStreamInfer reads a request of one-element raw tensors (what tritonclient sends)
without numpy (`kserve_grpc._raw_values`, `kserve.request_from_values`); the request it builds is
the tensor path's, and anything else still goes through the tensors."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc._utils import _get_inference_request

from benchmarks.llm_api_cpu import MODEL
from llm_engine.entrypoints import kserve
from llm_engine.entrypoints.kserve_grpc import InferenceServicer, _parameters, _raw_values, _tensors
from tests.llm_serving.test_hot_routes import _app

BENCH = [("text_input", "BYTES", [[b"def fib(n):"]]), ("max_tokens", "INT32", [[64]]),
         ("temperature", "FP32", [[0.0]]), ("ignore_eos", "BOOL", [[True]]), ("stream", "BOOL", [[True]])]
DTYPES = {"BYTES": object, "INT32": np.int32, "INT64": np.int64, "FP32": np.float32, "BOOL": bool}


def _request(inputs: list[tuple[str, str, Any]], **parameters: Any) -> Any:
    tensors = []
    for name, datatype, value in inputs:
        array = np.array(value, dtype=DTYPES[datatype])
        tensor = grpcclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return _get_inference_request(model_name=MODEL, inputs=tensors, model_version="", request_id="r",
                                  outputs=None, sequence_id=0, sequence_start=False, sequence_end=False,
                                  priority=0, timeout=None, parameters=parameters or None)


SERVICE: Any = type("S", (), {"served_name": MODEL})()
CASES = [
    BENCH,
    [*BENCH[:2], ("temperature", "FP32", [[0.1]]), ("top_p", "FP32", [[0.9]]), ("seed", "INT64", [[7]]),
     ("stop", "BYTES", [[b"\n"]]), ("stream", "BOOL", [[True]])],
    [("text_input", "BYTES", [["héllo".encode()]]), ("top_k", "INT32", [[-1]]), ("stream", "BOOL", [[True]])],
]


@pytest.mark.parametrize("inputs", CASES, ids=[str(i) for i in range(len(CASES))])
def test_the_same_request_as_through_tensors(inputs: list[tuple[str, str, Any]]) -> None:
    request = _request(inputs)
    values = _raw_values(request)
    assert values is not None
    fast = kserve.request_from_values(SERVICE, values, _parameters(request.parameters), True)
    assert fast is not None
    tensors = _tensors(request)
    tensors.pop("stream")
    [slow] = kserve.requests_from_tensors(SERVICE, tensors, _parameters(request.parameters))
    assert fast.model_dump() == slow.model_dump()


@pytest.mark.parametrize("inputs", [
    [("text_input", "BYTES", [[b"a", b"b"]]), BENCH[4]],  # two values
    [BENCH[0], ("max_tokens", "INT64", [[5]]), BENCH[4]],  # another datatype than the spec's
    [BENCH[0], ("nope", "INT32", [[5]]), BENCH[4]],
    [("text_input", "BYTES", [[b"\xff"]]), BENCH[4]],  # not UTF-8
])
def test_other_requests_go_through_the_tensors(inputs: list[tuple[str, str, Any]]) -> None:
    assert _raw_values(_request(inputs)) is None


def test_a_streamed_request_builds_no_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_tensors(*_args: Any) -> Any:
        raise AssertionError("a tensor was built")

    monkeypatch.setattr(kserve, "decode_raw", no_tensors)
    service = _app(hot=True).state.llm
    servicer = InferenceServicer(lambda: service, None)  # type: ignore[arg-type]

    async def responses() -> list[Any]:
        return [r async for r in servicer._stream_one(service, _request(BENCH))]

    answers = asyncio.run(responses())
    assert answers and not any(a.error_message for a in answers), [a.error_message for a in answers]
