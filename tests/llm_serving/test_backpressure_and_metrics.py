"""Cancellation frees KV blocks, a full queue answers 429, and /metrics moves as requests run."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llm_engine.entrypoints.service import ServerOptions

from .conftest import TINY_NAME, serve_model

REQUIRED = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions",
            "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success",
            "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
            "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds", "vllm:iteration_tokens_total",
            "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
            "vllm:request_inference_time_seconds"}


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics as {(sample name, sorted labels without model_name): value}."""
    text = httpx.get(url + "/metrics", timeout=10).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            samples[(s.name, labels)] = s.value
    return samples


def family_names(url: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text)}


def wait_for(check, timeout: float = 60.0) -> None:
    """Poll gently: a busy polling thread starves the engine thread of the GIL."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.3)


def test_metrics_exist_and_count_a_request_exactly(tiny_server, client):
    assert REQUIRED <= family_names(tiny_server.url)
    before = scrape(tiny_server.url)
    out = client.completions.create(model=TINY_NAME, prompt="count me please", max_tokens=9, temperature=0,
                                    extra_body={"ignore_eos": True})
    after = scrape(tiny_server.url)

    def delta(name: str, labels: tuple = ()) -> float:
        return after.get((name, labels), 0) - before.get((name, labels), 0)

    assert delta("vllm:prompt_tokens_total") == out.usage.prompt_tokens
    assert delta("vllm:generation_tokens_total") == 9
    assert delta("vllm:request_success_total", (("finished_reason", "length"),)) == 1
    assert delta("vllm:prefix_cache_queries_total") == out.usage.prompt_tokens
    for histogram in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                      "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                      "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds"):
        assert delta(histogram + "_count") == 1
    # the engine's part of the first token's path: queue + prefill is its TTFT, prefill + decode its inference
    queue, prefill, decode, inference, ttft = (delta(f"vllm:{h}_seconds_sum") for h in (
        "request_queue_time", "request_prefill_time", "request_decode_time", "request_inference_time",
        "time_to_first_token"))
    assert queue + prefill == pytest.approx(ttft, abs=1e-6) and prefill + decode == pytest.approx(inference, abs=1e-6)
    assert delta("vllm:inter_token_latency_seconds_count") == 8
    # steps process the prompt, then each sampled token but the last (which is never fed back)
    assert delta("vllm:iteration_tokens_total_sum") == out.usage.prompt_tokens + 8
    assert after[("vllm:num_requests_running", ())] == 0
    # the same prompt again is served from the prefix cache (all of its full blocks)
    client.completions.create(model=TINY_NAME, prompt="count me please " * 8, max_tokens=1)
    mid = scrape(tiny_server.url)
    client.completions.create(model=TINY_NAME, prompt="count me please " * 8, max_tokens=1)
    assert scrape(tiny_server.url)[("vllm:prefix_cache_hits_total", ())] > mid[("vllm:prefix_cache_hits_total", ())]


def test_disconnect_mid_stream_aborts_and_frees_blocks(tiny_server):
    before = scrape(tiny_server.url)
    body = {"model": TINY_NAME, "prompt": "a long story", "max_tokens": 480, "temperature": 0,
            "stream": True, "ignore_eos": True}
    with httpx.stream("POST", tiny_server.url + "/v1/completions", json=body, timeout=60) as r:
        events = (line for line in r.iter_lines() if line)
        for _ in range(3):
            assert next(events).startswith("data: {")
        assert scrape(tiny_server.url)[("vllm:kv_cache_usage_perc", ())] > 0  # it holds blocks now
    # the client has hung up: the request must end as "abort", its blocks back in the pool
    aborted = (("finished_reason", "abort"),)
    wait_for(lambda: scrape(tiny_server.url).get(("vllm:request_success_total", aborted), 0)
             == before.get(("vllm:request_success_total", aborted), 0) + 1)
    after = scrape(tiny_server.url)
    assert after[("vllm:num_requests_running", ())] == 0
    assert after[("vllm:kv_cache_usage_perc", ())] == 0
    assert after[("vllm:generation_tokens_total", ())] - before[("vllm:generation_tokens_total", ())] < 480
    stats = tiny_server.service.engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks


@pytest.fixture(scope="module")
def narrow_server(tiny_chat_model):
    """One running slot and one waiting slot: the third concurrent request is refused."""
    running = serve_model(tiny_chat_model, TINY_NAME, ServerOptions(max_waiting=1), max_num_seqs=1,
                          num_kv_blocks=256, max_model_len=4096)
    yield running
    running.stop()


def test_full_queue_answers_429_and_recovers(narrow_server):
    url = narrow_server.url
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    long_body = {"model": TINY_NAME, "prompt": "hold the slot", "max_tokens": 4000, "stream": True,
                 "ignore_eos": True}
    waiting_result: dict = {}

    def waiting_request() -> None:
        out = client.completions.create(model=TINY_NAME, prompt="I wait", max_tokens=2,
                                        extra_body={"ignore_eos": True})
        waiting_result["tokens"] = out.usage.completion_tokens

    with httpx.stream("POST", url + "/v1/completions", json=long_body, timeout=60) as running:
        lines = running.iter_lines()  # keep it: a dropped line iterator closes the connection
        assert next(lines).startswith("data: {")  # the slot is taken
        waiter = threading.Thread(target=waiting_request)
        waiter.start()
        wait_for(lambda: narrow_server.service.engine.num_waiting() == 1)
        with pytest.raises(openai.RateLimitError) as info:
            client.completions.create(model=TINY_NAME, prompt="one too many", max_tokens=2)
        assert info.value.status_code == 429 and info.value.body["code"] == "queue_full"
        assert info.value.response.headers["retry-after"]
    waiter.join(60)  # closing the long stream frees the slot for the waiting request
    assert waiting_result == {"tokens": 2}
