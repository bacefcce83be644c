"""/v2 (KServe v2 REST + Triton's generate extension), driven by the official tritonclient.http."""

from __future__ import annotations

import json
import socket
import time

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from llm_engine.config import EngineConfig
from llm_engine.entrypoints.app import create_app
from llm_engine.entrypoints.service import ServerOptions

from .conftest import TINY_NAME, free_port, start_server, unfinished_requests


@pytest.fixture
def triton(tiny_server):
    client = httpclient.InferenceServerClient(tiny_server.url.removeprefix("http://"), network_timeout=60)
    yield client
    client.close()


def text_inputs(prompts: list[str], binary: bool, **scalars) -> list[httpclient.InferInput]:
    """text_input as a [B, 1] BYTES tensor plus one-element sampling tensors."""
    texts = httpclient.InferInput("text_input", [len(prompts), 1], "BYTES")
    texts.set_data_from_numpy(np.array([[p.encode()] for p in prompts], dtype=object), binary_data=binary)
    inputs = [texts]
    types = {"max_tokens": ("INT32", np.int32), "temperature": ("FP32", np.float32), "ignore_eos": ("BOOL", bool),
             "seed": ("INT64", np.int64), "top_k": ("INT32", np.int32)}
    for name, value in scalars.items():
        datatype, dtype = types[name]
        tensor = httpclient.InferInput(name, [1, 1], datatype)
        tensor.set_data_from_numpy(np.array([[value]], dtype=dtype), binary_data=binary)
        inputs.append(tensor)
    return inputs


def strings(result, name: str) -> list[str]:
    """A BYTES output as text (tritonclient gives bytes from binary data, str from JSON)."""
    return [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy(name).reshape(-1)]


def v1_text(client, prompt: str, max_tokens: int) -> str:
    return client.completions.create(model=TINY_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text


def test_health_server_and_model_metadata(triton):
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready(TINY_NAME) and triton.is_model_ready(TINY_NAME, "1")
    assert not triton.is_model_ready("nope")
    server = triton.get_server_metadata()
    assert server["name"] == "codeyard-llm" and "binary_tensor_data" in server["extensions"]
    meta = triton.get_model_metadata(TINY_NAME)
    assert meta["name"] == TINY_NAME and meta["versions"] == ["1"]
    inputs = {t["name"]: t for t in meta["inputs"]}
    assert inputs["text_input"] == {"name": "text_input", "datatype": "BYTES", "shape": [-1, 1]}
    assert {"max_tokens", "temperature", "top_p", "top_k", "stream", "stop"} <= set(inputs)
    assert [t["name"] for t in meta["outputs"]][0] == "text_output"


def test_config_is_filled_from_the_engine_configuration(triton, tiny_server):
    config = triton.get_model_config(TINY_NAME)
    assert config["name"] == TINY_NAME and config["max_batch_size"] == 8  # the server's max_num_seqs
    assert config["model_transaction_policy"] == {"decoupled": True}
    params = {k: v["string_value"] for k, v in config["parameters"].items()}
    assert params["max_model_len"] == "512" and params["num_kv_blocks"] == "64" and params["block_size"] == "16"
    assert next(i for i in config["input"] if i["name"] == "text_input")["data_type"] == "TYPE_STRING"
    assert all(i.get("optional") for i in config["input"] if i["name"] != "text_input")


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_single_and_batched_match_v1(triton, client, binary):
    prompts = ["def add(a, b):", "Hello there", "x = [1, 2"]
    expected = [v1_text(client, p, 6) for p in prompts]
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary)
               for n in ("text_output", "finish_reason", "num_output_tokens")]
    single = triton.infer(TINY_NAME, text_inputs(prompts[:1], binary, max_tokens=6, temperature=0.0,
                                                 ignore_eos=True), outputs=outputs)
    assert strings(single, "text_output") == expected[:1]
    batch = triton.infer(TINY_NAME, text_inputs(prompts, binary, max_tokens=6, temperature=0.0, ignore_eos=True),
                         outputs=outputs, request_id="r1")
    assert strings(batch, "text_output") == expected
    assert batch.as_numpy("num_output_tokens").reshape(-1).tolist() == [6, 6, 6]
    assert strings(batch, "finish_reason") == ["length"] * 3
    assert batch.get_response()["id"] == "r1"


def test_generate_and_generate_stream(tiny_server, client):
    expected = v1_text(client, "Once upon", 8)
    url = f"{tiny_server.url}/v2/models/{TINY_NAME}"
    body = {"text_input": "Once upon", "max_tokens": 8, "parameters": {"temperature": 0, "ignore_eos": True}}
    out = httpx.post(url + "/generate", json=body, timeout=60).json()
    assert out["text_output"] == expected and out["num_output_tokens"] == 8 and out["model_name"] == TINY_NAME
    with httpx.stream("POST", url + "/generate_stream", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert len(events) > 1 and "".join(e["text_output"] for e in events) == expected
    assert sum(e["num_output_tokens"] for e in events) == 8 and events[-1]["finish_reason"] == "length"


def test_errors_in_the_protocol_shape(triton, tiny_server):
    url = f"{tiny_server.url}/v2/models"
    cases = [
        ("GET", f"{url}/nope", None, 404),
        ("GET", f"{url}/{TINY_NAME}/versions/7", None, 404),
        ("POST", f"{url}/{TINY_NAME}/infer", {"inputs": "x"}, 400),
        ("POST", f"{url}/{TINY_NAME}/infer", {"inputs": [{"name": "bogus", "datatype": "BYTES", "shape": [1],
                                                            "data": ["a"]}]}, 400),
        ("POST", f"{url}/{TINY_NAME}/infer", {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [2],
                                                            "data": ["a"]}]}, 400),
        ("POST", f"{url}/{TINY_NAME}/generate", {"text_input": "a", "temperature": 9}, 400),
        ("POST", f"{url}/{TINY_NAME}/generate", {"text_input": "a", "max_tokens": 100000}, 400),
    ]
    for method, target, body, status in cases:
        r = httpx.request(method, target, json=body, timeout=30)
        assert r.status_code == status, (target, body, r.text)
        assert isinstance(r.json()["error"], str) and r.json()["error"]
    with pytest.raises(InferenceServerException, match="temperature"):
        triton.infer(TINY_NAME, text_inputs(["a"], True, temperature=9.0))
    with pytest.raises(InferenceServerException, match="does not exist"):
        triton.get_model_metadata("nope")


def test_api_keys_guard_v2_and_grpc_but_not_health(tiny_chat_model):
    import tritonclient.grpc as grpcclient

    config = EngineConfig(model=str(tiny_chat_model), max_num_seqs=2, num_kv_blocks=16, max_model_len=128)
    grpc_address = f"127.0.0.1:{free_port()}"
    running = start_server(create_app(config, "keyed", ServerOptions(api_keys=frozenset({"k1"}),
                                                                     grpc_address=grpc_address)))
    try:
        running.service.engine.wait_ready(300)
        bare = httpclient.InferenceServerClient(running.url.removeprefix("http://"))
        assert bare.is_server_live() and bare.is_server_ready()  # probes carry no key
        with pytest.raises(InferenceServerException, match="API key"):
            bare.get_model_metadata("keyed")
        with pytest.raises(InferenceServerException) as info:
            bare.infer("keyed", text_inputs(["a"], True, max_tokens=1))
        assert info.value.status() == "401"
        keyed = bare.get_model_metadata("keyed", headers={"Authorization": "Bearer k1"})
        assert keyed["name"] == "keyed"
        rpc = grpcclient.InferenceServerClient(grpc_address)
        assert rpc.is_server_live() and rpc.is_server_ready()
        with pytest.raises(InferenceServerException) as info:
            rpc.get_model_metadata("keyed")
        assert info.value.status() == "StatusCode.UNAUTHENTICATED"
        assert rpc.get_model_metadata("keyed", headers={"authorization": "Bearer k1"}).name == "keyed"
        rpc.close()
    finally:
        running.stop()


def test_leaving_a_stream_aborts_the_request(tiny_server):
    body = {"text_input": "go on", "max_tokens": 400, "ignore_eos": True}
    with httpx.stream("POST", f"{tiny_server.url}/v2/models/{TINY_NAME}/generate_stream", json=body, timeout=60) as r:
        next(r.iter_lines())
    deadline = time.monotonic() + 10
    while unfinished_requests(tiny_server):
        assert time.monotonic() < deadline, "the request kept running after the client left"
        time.sleep(0.05)


def test_leaving_an_infer_aborts_the_request(tiny_server):
    body = json.dumps({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": ["go on"]},
                                  {"name": "max_tokens", "datatype": "INT32", "shape": [1, 1], "data": [400]},
                                  {"name": "ignore_eos", "datatype": "BOOL", "shape": [1, 1], "data": [True]}]})
    host, port = tiny_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as conn:  # a client that hangs up mid-request
        conn.sendall(f"POST /v2/models/{TINY_NAME}/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
                     f"\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
        deadline = time.monotonic() + 10
        while not unfinished_requests(tiny_server):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    deadline = time.monotonic() + 10
    while unfinished_requests(tiny_server):
        assert time.monotonic() < deadline, "the request kept running after the client left"
        time.sleep(0.05)
