"""KServe v2 gRPC inside the IDE server (CODEYARD_LLM_GRPC_PORT), driven by the official tritonclient.grpc:
personal API tokens only, the same lazily loaded LLM as /v1, closed with the server."""

from __future__ import annotations

import queue
import time

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from ide_server.app import create_app
from ide_server.settings import Settings

from .conftest import start_server
from .test_ide_component import personal_token
from .test_kserve_grpc import inputs, texts


@pytest.fixture(scope="module")
def ide(tmp_path_factory, tiny_chat_model):
    settings = Settings(data_dir=tmp_path_factory.mktemp("ide-grpc"), llm_model=str(tiny_chat_model), llm_grpc_port=0)
    running = start_server(create_app(settings))
    yield running
    running.stop()
    running.app.state.engine.dispose()


@pytest.fixture
def rpc(ide):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{ide.app.state.services.llm_grpc_port}")
    yield client
    client.close()


def status_of(call) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value.status()


def test_refused_without_a_token_or_with_a_bad_one(rpc, tiny_chat_model):
    name = tiny_chat_model.name
    assert rpc.is_server_live()  # health stays open to probes
    for headers in (None, {"authorization": "Bearer cy_not-a-token"}, {"authorization": "Basic eDp5"}):
        assert status_of(lambda: rpc.get_model_metadata(name, headers=headers)) == "StatusCode.UNAUTHENTICATED"
        assert status_of(lambda: rpc.infer(name, inputs(["a"]), headers=headers)) == "StatusCode.UNAUTHENTICATED"
    responses: queue.Queue = queue.Queue()
    rpc.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        try:
            rpc.async_stream_infer(name, inputs(["a"], stream=True))
        except InferenceServerException:  # the stream was already refused: the reason is in the callback
            pass
        result, error = responses.get(timeout=60)
        assert result is None and error.status() == "StatusCode.UNAUTHENTICATED"
    finally:
        rpc.stop_stream()


def test_a_users_token_infers_and_streams(ide, rpc, tiny_chat_model):
    name = tiny_chat_model.name
    headers = {"authorization": f"Bearer {personal_token(ide.url)}"}
    deadline = time.monotonic() + 120
    while not rpc.is_model_ready(name, headers=headers):  # the first call starts the load
        assert time.monotonic() < deadline, "model did not load"
        time.sleep(0.2)
    assert rpc.get_model_metadata(name, headers=headers).name == name
    result = rpc.infer(name, inputs(["def add(a, b):", "Hi"], max_tokens=3, ignore_eos=True), headers=headers)
    assert result.as_numpy("num_output_tokens").reshape(-1).tolist() == [3, 3]

    responses: queue.Queue = queue.Queue()
    rpc.start_stream(callback=lambda result, error: responses.put((result, error)), headers=headers)
    try:
        rpc.async_stream_infer(name, inputs(["Once upon"], stream=True, max_tokens=6, temperature=0.0,
                                            ignore_eos=True))
        pieces = []
        while True:
            result, error = responses.get(timeout=60)
            assert error is None
            pieces.append(texts(result)[0])
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        assert len(pieces) > 1
    finally:
        rpc.stop_stream()


def test_the_port_opens_only_when_set_and_closes_with_the_server(tmp_path):
    running = start_server(create_app(Settings(data_dir=tmp_path / "on", llm_model="off", llm_grpc_port=0)))
    address = f"127.0.0.1:{running.app.state.services.llm_grpc_port}"
    client = grpcclient.InferenceServerClient(address)
    try:
        assert client.is_server_live() and not client.is_server_ready()  # no model here: not ready
    finally:
        running.stop()
        running.app.state.engine.dispose()
    assert status_of(client.is_server_live) == "StatusCode.UNAVAILABLE"
    client.close()
    unset = start_server(create_app(Settings(data_dir=tmp_path / "off")))
    try:
        assert unset.app.state.services.llm_grpc_port is None
    finally:
        unset.stop()
        unset.app.state.engine.dispose()
