"""The engine core in its own process (the servers' default) behind /v1 and /v2: the offline engine's
answers, the stats and metrics carried across, and a dead core reported as a clear 503, not a hang.
The servers' other tests run on it too (`tiny_server` serves with `engine_process=True`)."""

from __future__ import annotations

import os
import signal

import httpx
import openai
import pytest

from llm_engine import LLM, SamplingParams
from llm_engine.entrypoints.service import ServerOptions

from .conftest import TINY_NAME, serve_model

PROMPT = "def add(a, b):"


def complete(url: str, prompt: str, stream: bool = False):
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    return client.completions.create(model=TINY_NAME, prompt=prompt, max_tokens=6, temperature=0, stream=stream,
                                     extra_body={"ignore_eos": True})


def test_v1_and_v2_answer_through_the_core_process_as_the_offline_engine_does(tiny_server, tiny_chat_model):
    engine = tiny_server.service.engine
    assert engine.core is not None and engine.core.pid != os.getpid() and engine.core.poll() is None
    offline = LLM(model=str(tiny_chat_model), dtype="float32", num_kv_blocks=64, max_model_len=512).generate(
        [PROMPT], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True), use_tqdm=False)
    answer = complete(tiny_server.url, PROMPT)
    assert answer.choices[0].text == offline[0].outputs[0].text and answer.usage.completion_tokens == 6
    streamed = "".join(c.choices[0].text for c in complete(tiny_server.url, PROMPT, stream=True) if c.choices)
    assert streamed == answer.choices[0].text
    v2 = httpx.post(f"{tiny_server.url}/v2/models/{TINY_NAME}/generate", timeout=60,
                    json={"text_input": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True})
    assert v2.status_code == 200 and v2.json()["text_output"] == answer.choices[0].text
    metrics = httpx.get(tiny_server.url + "/metrics").text  # the core's stats reach this process's /metrics
    assert any(line.startswith(f'vllm:generation_tokens_total{{model_name="{TINY_NAME}"}}')
               and float(line.split()[-1]) >= 18 for line in metrics.splitlines())


def test_bad_input_is_refused_by_the_api_process_and_the_core_serves_on(tiny_server):
    response = httpx.post(tiny_server.url + "/v1/completions", timeout=30,
                          json={"model": TINY_NAME, "prompt": [10 ** 9], "max_tokens": 2})
    assert response.status_code == 400 and "outside the vocabulary" in response.json()["error"]["message"]
    assert complete(tiny_server.url, "x = ").usage.completion_tokens == 6


def test_a_killed_core_fails_requests_in_flight_and_later_ones_with_503(tiny_chat_model):
    running = serve_model(tiny_chat_model, TINY_NAME, ServerOptions(engine_process=True), max_num_seqs=2,
                          num_kv_blocks=64, max_model_len=512, dtype="float32")
    try:
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="u", max_retries=0, timeout=60)
        stream = client.completions.create(model=TINY_NAME, prompt="def f():", max_tokens=400, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))  # the request is in flight
        os.kill(running.service.engine.core.pid, signal.SIGKILL)
        with pytest.raises(openai.APIError) as failed:  # the stream ends with an error event, not a hang
            for _ in stream:
                pass
        assert "engine core process exited (signal 9)" in str(failed.value)
        later = httpx.post(running.url + "/v1/completions", timeout=30,
                           json={"model": TINY_NAME, "prompt": "x", "max_tokens": 2})
        assert later.status_code == 503 and "signal 9" in later.json()["error"]["message"]
        assert httpx.get(running.url + "/health").status_code == 503
    finally:
        running.stop()
