"""Beam search through the completions endpoint (vLLM's use_beam_search / best_of fields): one beam
group per prompt inside the engine, through the engine core's process (`llm serve`'s default) and
the in-thread engine alike."""

from __future__ import annotations

import json
import socket
import time

import openai
import pytest
from openai import OpenAI

from llm_engine import LLM, BeamSearchParams
from llm_engine.entrypoints.service import ServerOptions

from .conftest import TINY_NAME, serve_model, unfinished_requests

PROMPTS = ["def add(a, b):", "The capital of"]


@pytest.fixture(scope="module")
def thread_server(tiny_chat_model):
    """As `tiny_server` (the engine core in its own process), with the engine in a thread instead."""
    running = serve_model(tiny_chat_model, TINY_NAME, ServerOptions(max_waiting=8, engine_process=False),
                          max_num_seqs=8, num_kv_blocks=64, max_model_len=512, dtype="float32")
    yield running
    running.stop()


@pytest.fixture(params=["core process", "thread"])
def server(request, tiny_server):
    return tiny_server if request.param == "core process" else request.getfixturevalue("thread_server")


@pytest.fixture
def beam_client(server):
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def offline_beams(tiny_chat_model, smollm_tokenizer):
    offline = LLM(model=str(tiny_chat_model), dtype="float32").beam_search(
        PROMPTS, BeamSearchParams(beam_width=3, max_tokens=5, ignore_eos=True))
    return [[smollm_tokenizer.decode(beam.output_tokens) for beam in result.sequences] for result in offline]


def test_use_beam_search_returns_the_n_best_beams_of_llm_beam_search(server, beam_client, offline_beams):
    before = server.service.engine.stats()
    out = beam_client.completions.create(model=TINY_NAME, prompt=PROMPTS, n=2, max_tokens=5, temperature=0,
                                         extra_body={"use_beam_search": True, "best_of": 3, "ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert out.usage.completion_tokens == 4 * 5
    assert [c.text for c in out.choices] == [text for beams in offline_beams for text in beams[:2]]
    assert {c.finish_reason for c in out.choices} == {"length"}
    # one request per prompt: each prompt prefilled once, its beams forked inside the engine (the
    # previous design sent every beam's history as a new one-token request each step)
    after = server.service.engine.stats()
    assert after.prompt_tokens_total - before.prompt_tokens_total == out.usage.prompt_tokens
    assert after.num_free_blocks == after.num_total_blocks


@pytest.mark.parametrize(("extra", "message"), [
    ({"use_beam_search": True, "best_of": 1}, "best_of (1) must be at least n (2)"),
    ({"use_beam_search": True, "echo": True}, "echo is not supported with use_beam_search"),
    ({"use_beam_search": True, "logprobs": 2}, "logprobs is not supported with use_beam_search"),
    ({"use_beam_search": True, "stop": ["\n"]}, "stop is not supported with use_beam_search"),
    ({"use_beam_search": True, "structured_outputs": {"choice": ["a", "b"]}},
     "structured_outputs is not supported with use_beam_search"),
    ({"use_beam_search": True, "best_of": 16}, "beam_width: 16 beams do not fit max_num_seqs 8"),
])
def test_beam_search_refuses_what_it_cannot_do(beam_client, extra, message):
    with pytest.raises(openai.BadRequestError) as info:
        beam_client.completions.create(model=TINY_NAME, prompt="x", n=2, max_tokens=3, extra_body=extra)
    assert message in info.value.body["message"]
    with pytest.raises(openai.BadRequestError, match="stream is not supported"):
        beam_client.completions.create(model=TINY_NAME, prompt="x", max_tokens=3, stream=True,
                                       extra_body={"use_beam_search": True})


def test_beams_that_do_not_fit_the_kv_pool_are_a_400(beam_client):
    # max_tokens unset fills the window: 3 beams of 512 tokens need 96 blocks of the pool's 64
    with pytest.raises(openai.BadRequestError, match="beam_width: 3 beams of 512 tokens need 96 KV blocks"):
        beam_client.completions.create(model=TINY_NAME, prompt="x", max_tokens=None,
                                       extra_body={"use_beam_search": True, "best_of": 3})


def test_a_client_that_hangs_up_aborts_the_beam_group_and_frees_its_blocks(server):
    engine = server.service.engine
    aborted_before = engine.stats().finished_by_reason.get("abort", 0)
    body = json.dumps({"model": TINY_NAME, "prompt": "a long story", "max_tokens": 300, "use_beam_search": True,
                       "best_of": 2, "ignore_eos": True})
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
                     f"\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
        deadline = time.monotonic() + 30
        while engine.stats().num_running < 2:  # both beams run (forked from the first)
            assert time.monotonic() < deadline, "the beams did not start"
            time.sleep(0.01)
    deadline = time.monotonic() + 30
    while unfinished_requests(server):
        assert time.monotonic() < deadline, "the beams kept running after the client left"
        time.sleep(0.05)
    stats = engine.stats()
    assert stats.finished_by_reason.get("abort", 0) - aborted_before == 2  # both live beams, not finished
    assert stats.num_free_blocks == stats.num_total_blocks
