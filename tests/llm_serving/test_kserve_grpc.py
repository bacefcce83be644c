"""The KServe v2 GRPCInferenceService, driven by the official tritonclient.grpc."""

from __future__ import annotations

import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from llm_engine.entrypoints import kserve, kserve_grpc
from llm_engine.entrypoints.kserve import RowResult

from .conftest import TINY_NAME, unfinished_requests
from .test_kserve_http import v1_text


@pytest.fixture
def triton(tiny_server):
    client = grpcclient.InferenceServerClient(tiny_server.service.options.grpc_address)
    yield client
    client.close()


def inputs(prompts: list[str], stream: bool | None = None, **scalars) -> list[grpcclient.InferInput]:
    texts = grpcclient.InferInput("text_input", [len(prompts), 1], "BYTES")
    texts.set_data_from_numpy(np.array([[p.encode()] for p in prompts], dtype=object))
    result = [texts]
    types = {"max_tokens": ("INT32", np.int32), "temperature": ("FP32", np.float32), "ignore_eos": ("BOOL", bool)}
    if stream is not None:
        scalars["stream"] = stream
        types["stream"] = ("BOOL", bool)
    for name, value in scalars.items():
        datatype, dtype = types[name]
        tensor = grpcclient.InferInput(name, [1, 1], datatype)
        tensor.set_data_from_numpy(np.array([[value]], dtype=dtype))
        result.append(tensor)
    return result


def texts(result) -> list[str]:
    return [v.decode() for v in result.as_numpy("text_output").reshape(-1)]


def test_health_metadata_config(triton):
    assert triton.is_server_live() and triton.is_server_ready() and triton.is_model_ready(TINY_NAME)
    assert not triton.is_model_ready("nope")
    assert triton.get_server_metadata().name == "codeyard-llm"
    meta = triton.get_model_metadata(TINY_NAME, as_json=True)
    assert meta["versions"] == ["1"] and meta["inputs"][0] == {"name": "text_input", "datatype": "BYTES",
                                                               "shape": ["-1", "1"]}
    config = triton.get_model_config(TINY_NAME).config
    assert config.max_batch_size == 8 and config.model_transaction_policy.decoupled
    assert config.parameters["num_kv_blocks"].string_value == "64"


def test_infer_single_and_batched_match_v1(triton, client):
    prompts = ["def add(a, b):", "Hello there"]
    expected = [v1_text(client, p, 5) for p in prompts]
    result = triton.infer(TINY_NAME, inputs(prompts, max_tokens=5, temperature=0.0, ignore_eos=True))
    assert texts(result) == expected
    assert result.as_numpy("num_output_tokens").reshape(-1).tolist() == [5, 5]


def test_stream_infer_streams_tokens_and_ends_with_a_final_flag(triton, client):
    expected = v1_text(client, "Once upon", 8)
    responses: queue.Queue = queue.Queue()
    triton.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        triton.async_stream_infer(TINY_NAME, inputs(["Once upon"], stream=True, max_tokens=8, temperature=0.0,
                                                     ignore_eos=True), request_id="s1")
        pieces = []
        while True:
            result, error = responses.get(timeout=60)
            assert error is None
            response = result.get_response()
            assert response.id == "s1"
            pieces.append(texts(result)[0])
            if response.parameters["triton_final_response"].bool_param:
                break
        assert len(pieces) > 1 and "".join(pieces) == expected
        triton.async_stream_infer(TINY_NAME, inputs(["a"], temperature=9.0))  # errors arrive in-stream
        result, error = responses.get(timeout=60)
        assert result is None and "temperature" in str(error)
    finally:
        triton.stop_stream()


def test_errors_map_to_grpc_status(triton):
    cases = [(lambda: triton.get_model_metadata("nope"), "StatusCode.NOT_FOUND"),
             (lambda: triton.infer(TINY_NAME, inputs(["a"], temperature=9.0)), "StatusCode.INVALID_ARGUMENT"),
             (lambda: triton.infer(TINY_NAME, inputs(["a"], stream=True)), "StatusCode.INVALID_ARGUMENT"),
             (lambda: triton.get_model_config(TINY_NAME, model_version="3"), "StatusCode.NOT_FOUND")]
    for call, status in cases:
        with pytest.raises(InferenceServerException) as info:
            call()
        assert info.value.status() == status


def test_stopping_a_stream_aborts_its_request(triton, tiny_server):
    responses: queue.Queue = queue.Queue()
    triton.start_stream(callback=lambda result, error: responses.put((result, error)))
    triton.async_stream_infer(TINY_NAME, inputs(["go on"], stream=True, max_tokens=400, ignore_eos=True))
    responses.get(timeout=60)  # it is generating
    triton.stop_stream(cancel_requests=True)
    deadline = time.monotonic() + 10
    while unfinished_requests(tiny_server):
        assert time.monotonic() < deadline, "the request kept running after the stream was cancelled"
        time.sleep(0.05)


@pytest.mark.parametrize("delta", [RowResult(0, " héllo", None, 1), RowResult(0, "", "length", 3)])
def test_streamed_piece_packs_the_same_tensors_as_numpy(delta):
    """The per-token fast path writes exactly what the numpy arrays and tritonclient's serializer do,
    in the response _response would build (all outputs, or the ones the request names)."""
    assert kserve_grpc.delta_outputs(delta) == kserve_grpc.raw_outputs(kserve.output_arrays([delta]))
    for wanted in ([], ["num_output_tokens", "text_output"]):
        request = pb.ModelInferRequest(model_name=TINY_NAME, id="r1",
                                       outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name=n) for n in wanted])
        expected = kserve_grpc._response(request, kserve_grpc.delta_outputs(delta), final=delta.finish_reason is not None)
        piece = kserve_grpc._piece(kserve_grpc._piece_template(request), delta)
        assert piece == pb.ModelStreamInferResponse(infer_response=expected)
