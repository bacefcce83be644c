"""A Triton-style ensemble declared in config (code context -> LLM -> trim to the line), over /v2
HTTP and gRPC with the official clients."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from llm_engine.entrypoints.ensemble import Ensemble

from .conftest import ENSEMBLE_CONFIG, TINY_NAME

PREFIX, CONTEXT = "def total(items):\n    return ", "# helpers.py\ndef price(item): ..."


def tensor(module, name: str, value, datatype: str):
    t = module.InferInput(name, [1, 1], datatype)
    dtype = {"BYTES": object, "INT32": np.int32, "FP32": np.float32}[datatype]
    t.set_data_from_numpy(np.array([[value]], dtype=dtype))
    return t


def test_metadata_and_config_describe_the_pipeline(tiny_server):
    client = httpclient.InferenceServerClient(tiny_server.url.removeprefix("http://"))
    meta = client.get_model_metadata("code-completion")
    assert meta["platform"] == "ensemble" and [t["name"] for t in meta["outputs"]] == ["completion"]
    steps = client.get_model_config("code-completion")["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["code_context", "llm", "trim_to_line"]
    assert client.is_model_ready("code-completion")
    rpc = grpcclient.InferenceServerClient(tiny_server.service.options.grpc_address)
    config = rpc.get_model_config("code-completion").config
    assert config.platform == "ensemble" and len(config.ensemble_scheduling.step) == 3
    rpc.close()


def test_infer_runs_the_steps_over_http_and_grpc(tiny_server, client):
    full = client.completions.create(model=TINY_NAME, prompt=f"{CONTEXT}\n\n{PREFIX}", max_tokens=24,
                                     temperature=0).choices[0].text
    expected = full.split("\n", 1)[0]
    http = httpclient.InferenceServerClient(tiny_server.url.removeprefix("http://"))
    inputs = [tensor(httpclient, "prefix", PREFIX.encode(), "BYTES"),
              tensor(httpclient, "context", CONTEXT.encode(), "BYTES"),
              tensor(httpclient, "max_tokens", 24, "INT32"), tensor(httpclient, "temperature", 0.0, "FP32")]
    out = http.infer("code-completion", inputs).as_numpy("completion").reshape(-1)[0].decode()
    assert out == expected and "\n" not in out
    rpc = grpcclient.InferenceServerClient(tiny_server.service.options.grpc_address)
    inputs = [tensor(grpcclient, "prefix", PREFIX.encode(), "BYTES"),
              tensor(grpcclient, "context", CONTEXT.encode(), "BYTES"),
              tensor(grpcclient, "max_tokens", 24, "INT32"), tensor(grpcclient, "temperature", 0.0, "FP32")]
    assert rpc.infer("code-completion", inputs).as_numpy("completion").reshape(-1)[0].decode() == expected
    with pytest.raises(InferenceServerException, match="text_input"):  # only the ensemble's own inputs
        rpc.infer("code-completion", [tensor(grpcclient, "text_input", b"x", "BYTES")])
    rpc.close()


def test_a_bad_config_is_refused_naming_the_problem(tmp_path):
    config = json.loads(ENSEMBLE_CONFIG.read_text())
    config["ensemble_scheduling"]["step"][1]["model_name"] = "gpt-9"
    with pytest.raises(ValueError, match="unknown step model 'gpt-9'"):
        Ensemble(config)
    config = json.loads(ENSEMBLE_CONFIG.read_text())
    config["ensemble_scheduling"]["step"][2]["input_map"] = {"text": "nowhere"}
    with pytest.raises(ValueError, match="nowhere"):
        Ensemble(config)
