"""Data-parallel replicas behind the router, through the official openai client: prompts sharing
a preamble go to the replica that cached it, new preambles to the emptier one, a stopped
replica's requests go to the other, and the router checks its own key."""

from __future__ import annotations

import httpx
import openai
import pytest

from llm_engine.entrypoints.router import create_router_app

from .conftest import serve_model, start_server

PREAMBLES = ["You are a patient tutor for a class learning Python loops. " * 4,
             "Explain the following compiler error to a beginner in plain words. " * 4]


@pytest.fixture
def replicas(tiny_chat_model):
    running = [serve_model(tiny_chat_model, "tiny", max_num_seqs=4, num_kv_blocks=128, max_model_len=512)
               for _ in range(2)]
    yield running
    for replica in running:
        replica.stop()


def client_for(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


def complete(client: openai.OpenAI, prompt: str) -> str:
    out = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0,
                                    extra_body={"ignore_eos": True})
    return out.choices[0].text


def queries(replica) -> int:
    return replica.service.engine.require_engine().get_stats().prefix_cache_queries


def test_shared_preambles_stay_on_the_replica_that_cached_them(replicas):
    router = start_server(create_router_app([r.url for r in replicas]))
    try:
        client = client_for(router.url)
        first = [complete(client, PREAMBLES[0] + f"Question {i}: what does range({i}) give?") for i in range(3)]
        busy = [queries(r) for r in replicas]
        owner, other = (0, 1) if busy[0] else (1, 0)
        assert busy[owner] > 0 and busy[other] == 0  # one replica took all three
        for i in range(3):
            complete(client, PREAMBLES[1] + f"Error {i}: NameError")
        after = [queries(r) for r in replicas]
        assert after[owner] == busy[owner] and after[other] > 0  # the new preamble: the emptier replica
        hits = [r.service.engine.require_engine().get_stats().prefix_cache_hits for r in replicas]
        assert sum(hits) > 0
        direct = client_for(replicas[0].url)
        assert first[0] == complete(direct, PREAMBLES[0] + "Question 0: what does range(0) give?")
    finally:
        router.stop()


def test_a_stopped_replica_is_routed_around(replicas):
    router = start_server(create_router_app([r.url for r in replicas]))
    try:
        client = client_for(router.url)
        complete(client, PREAMBLES[0] + "warm up")
        owner = max(range(2), key=lambda i: queries(replicas[i]))
        replicas[owner].stop()
        for i in range(3):  # the same preamble: its replica is gone, the other answers
            assert complete(client, PREAMBLES[0] + f"Question {i}")
        health = httpx.get(router.url + "/health", timeout=10).json()
        assert health["alive"] == 1
        assert queries(replicas[1 - owner]) > 0
    finally:
        router.stop()


def test_router_checks_its_key_and_body(replicas):
    router = start_server(create_router_app([r.url for r in replicas], api_keys=frozenset({"sekrit"})))
    try:
        with pytest.raises(openai.AuthenticationError):
            complete(client_for(router.url, "wrong"), "hi")
        assert complete(client_for(router.url, "sekrit"), "hi")
        bad = httpx.post(router.url + "/v1/completions", content=b"[1, 2", timeout=10,
                         headers={"Authorization": "Bearer sekrit"})
        assert bad.status_code == 400 and "JSON" in bad.json()["error"]["message"]
        assert httpx.get(router.url + "/v1/models", timeout=10).status_code == 401
    finally:
        router.stop()
