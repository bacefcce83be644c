"""`codeyard llm serve` as users run it: a subprocess serving a model on a port."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest
import tritonclient.grpc

from llm_engine.async_engine import ENGINE_THREAD
from llm_engine.cli import parse_cpus, parse_json_option

from .conftest import free_port

CODEYARD = [str(Path(sys.executable).parent / "codeyard")]  # the venv's console script


def wait_healthy(proc: subprocess.Popen, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "server not ready"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)


def test_bad_model_is_one_line_and_exit_2():
    result = subprocess.run([*CODEYARD, "llm", "serve", "--model", "/no/such/model"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "does not exist" in result.stderr


def test_bad_speculative_config_is_one_line_and_exit_2(tiny_chat_model):
    result = subprocess.run([*CODEYARD, "llm", "serve", "--model", str(tiny_chat_model), "--speculative-config",
                             '{"method": "medusa"}'], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "speculative_config.method" in result.stderr
    with pytest.raises(ValueError, match="--speculative-config: not valid JSON"):
        parse_json_option("{nope", "--speculative-config")


def test_engine_cpus_is_a_list_of_this_machines_cpus():
    assert parse_cpus("0") == parse_cpus("0-0,0") == {0}
    for bad in ("zero", "", "1-", f"0-{os.cpu_count()}"):
        with pytest.raises(ValueError, match="CPU"):
            parse_cpus(bad)


def test_serve_answers_openai_requests(tiny_chat_model):
    port, grpc_port = free_port(), free_port()
    proc = subprocess.Popen([*CODEYARD, "llm", "serve", "--model", str(tiny_chat_model), "--port", str(port),
                             "--grpc-port", str(grpc_port), "--served-model-name", "tiny", "--max-num-seqs", "4",
                             "--engine-cpus", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(proc, port, 180)
        # the engine runs in its own process, which --engine-cpus pins; the server's stays unpinned
        (core,) = psutil.Process(proc.pid).children()
        assert core.name() == ENGINE_THREAD and core.cpu_affinity() == [0]
        assert os.sched_getaffinity(proc.pid) == os.sched_getaffinity(0)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        out = client.completions.create(model="tiny", prompt="hello", max_tokens=3, extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 3
        assert httpx.get(f"http://127.0.0.1:{port}/v2/models/tiny/ready", timeout=10).status_code == 200
        rpc = tritonclient.grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        assert rpc.is_model_ready("tiny")
        rpc.close()
    finally:
        proc.terminate()
        output = proc.communicate(timeout=60)[0]
    assert "loading" in output and "100%" in output  # load progress is logged
    assert '"POST /v1/completions HTTP/1.1" 200' in output  # the access line (access_log.LateAccessLog)
    core.wait(30)  # the core ends with the server
