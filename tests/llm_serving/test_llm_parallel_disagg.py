"""Disaggregated serving for real: `codeyard llm serve --role prefill` and `--role decode` as two
processes (each pinned to a core), the proxy in front, through the official openai client. A mixed
batch, streamed and not, completions and chat, gives one engine's greedy answers. A client that
leaves mid-stream leaves no block held on either instance. Killing the decode instance mid-stream
ends that stream with a clear error, the prefill instance's blocks are all free, the service keeps
answering, and the launcher starts the instance again (the new one holds no block). The prefill
instance takes the shortest prompt first. With max_local_prefill_length, short prompts go whole to
the decode instance. One pair serves the whole module (processes are slow to start); the
engine-level transfers are in tests/llm_engine/test_llm_parallel_kv_connector.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from llm_engine.entrypoints.disagg_proxy import create_disagg_app, prefill_payload, prompt_tokens_bound
from llm_engine.entrypoints.disagg_servers import (
    PREFILL_STEP_TOKENS,
    decode_engine_alone,
    disaggregated_servers,
    proxy_beside_prefill,
    role_args,
)
from llm_engine.entrypoints.replicas import RESTART_DELAYS_S, Supervisor

from .conftest import start_server
from .test_cli import CODEYARD

NAME = "tiny"
PROMPTS = ["def add(a, b):", "The quick brown fox " * 12, "Write a haiku about compilers.\n" * 5,
           "x = [i * i for i in range(10)]\n" * 9, "Hello"]


@pytest.fixture(scope="module")
def pair(tiny_chat_model):
    args = ["--model", str(tiny_chat_model), "--served-model-name", NAME, "--kv-cache-memory", "8MiB",
            "--max-num-seqs", "8", "--max-num-batched-tokens", "64"]
    with disaggregated_servers(args, pin=False, ready_timeout_s=300) as children:  # pinned: slower to start
        proxy = start_server(create_disagg_app(children.urls[0], children.urls[1], frozenset({"outer"}), children.key))
        try:
            yield children, proxy
        finally:
            proxy.stop()


def client_for(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


def complete(client: openai.OpenAI, prompt: str, max_tokens: int, stream: bool) -> str:
    kwargs = dict(model=NAME, prompt=prompt, max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True})
    if stream:
        return "".join(chunk.choices[0].text for chunk in client.completions.create(stream=True, **kwargs))
    return client.completions.create(**kwargs).choices[0].text


def chat(client: openai.OpenAI, text: str) -> str:
    out = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": text}], max_tokens=12,
                                         temperature=0, extra_body={"ignore_eos": True})
    return out.choices[0].message.content


def metric(url: str, key: str, name: str, label: str = "") -> float:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=10).text
    return float(re.search(rf"^{re.escape(name)}\{{[^}}]*{re.escape(label)}[^}}]*\}} (\S+)$", text, re.M).group(1))


def test_a_mixed_batch_gets_one_engines_greedy_answers(pair):
    children, proxy = pair
    split = client_for(proxy.url, "outer")
    whole = client_for(children.urls[0], children.key)  # the prefill instance alone: one engine
    jobs = [(p, 6 + 3 * i, i % 2 == 0) for i, p in enumerate(PROMPTS)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda job: complete(split, *job), jobs))
    assert answers == [complete(whole, *job) for job in jobs]
    assert chat(split, "What is a closure?") == chat(whole, "What is a closure?")
    decode_url = children.urls[1]
    assert metric(decode_url, children.key, "vllm:prompt_tokens_total") > 0  # the decode side served them
    # --max-num-batched-tokens 64: the prompts (one of ~135 tokens, 5 at once) were chunked
    steps = metric(children.urls[0], children.key, "vllm:iteration_tokens_total_count")
    assert metric(children.urls[0], children.key, "vllm:iteration_tokens_total_bucket", 'le="64.0"') == steps
    assert metric(children.urls[0], children.key, "vllm:iteration_tokens_total_bucket", 'le="16.0"') < steps
    with pytest.raises(openai.AuthenticationError):
        complete(client_for(proxy.url, "wrong"), "hi", 2, False)


def test_the_prefill_instance_computes_long_prompts_in_chunks_unless_given_a_budget():
    """A short prompt waits on the prefill instance for one chunk of a long prompt, not all of it
    (the scheduler's priority policy puts it before the chunks that follow)."""
    prefill_args, decode_args = role_args(["--model", "m"], "127.0.0.1", 4000, "shm")
    assert prefill_args[prefill_args.index("--max-num-batched-tokens") + 1] == str(PREFILL_STEP_TOKENS)
    assert "--max-num-batched-tokens" not in decode_args
    given = role_args(["--model", "m", "--max-num-batched-tokens", "64"], "127.0.0.1", 4000, "shm")
    assert [args.count("--max-num-batched-tokens") for args in given] == [1, 1]


def test_the_prefill_instance_takes_the_shortest_prompt_first(pair):
    """The launcher runs the prefill instance with the priority policy (the decode instance keeps
    the default) and the proxy asks it for the prompt's length as the priority."""
    children, _ = pair
    policies = [httpx.get(f"{url}/v2/models/{NAME}/config", headers={"Authorization": f"Bearer {children.key}"},
                          timeout=10).json()["parameters"]["batch_scheduler_policy"]["string_value"]
                for url in children.urls]
    assert policies == ["priority", "fcfs"]
    assert prefill_payload({"model": NAME, "prompt": "héllo", "priority": -3})["priority"] == 6  # UTF-8 bytes
    assert prefill_payload({"model": NAME, "prompt": [5, 6, 7], "stream": True})["priority"] == 3


def test_short_prompts_are_prefilled_on_the_decode_instance_under_max_local_prefill_length(pair):
    """A prompt surely within max_local_prefill_length runs whole on the decode instance (the
    prefill instance computes nothing for it); a longer one is still split. One engine's answers
    either way."""
    children, _ = pair
    proxy = start_server(create_disagg_app(children.urls[0], children.urls[1], frozenset({"outer"}), children.key,
                                           max_local_prefill_length=32))
    try:
        split, whole = client_for(proxy.url, "outer"), client_for(children.urls[0], children.key)
        short, long = PROMPTS[0], PROMPTS[1]  # 14 and 240 bytes
        expected = [complete(whole, short, 6, True), complete(whole, long, 6, False)]
        prefilled = metric(children.urls[0], children.key, "vllm:prompt_tokens_total")
        assert complete(split, short, 6, True) == expected[0]
        assert metric(children.urls[0], children.key, "vllm:prompt_tokens_total") == prefilled
        assert complete(split, long, 6, False) == expected[1]
        assert metric(children.urls[0], children.key, "vllm:prompt_tokens_total") > prefilled
    finally:
        proxy.stop()


def test_the_proxys_prompt_bound_is_at_least_the_tokens(tiny_chat_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_chat_model)
    for text in ["def add(a, b):", "héllo wörld 😀 ∑", "    \n\t\t}\n"]:
        assert len(tokenizer(text).input_ids) <= prompt_tokens_bound({"prompt": text})
    messages = [{"role": "user", "content": "Ünïcode? 😀"}]
    templated = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    assert len(templated) <= prompt_tokens_bound({"messages": messages})
    assert prompt_tokens_bound({"prompt": [5, 6, 7]}) == prompt_tokens_bound({"prompt": [[5, 6, 7]]}) == 3


def test_a_client_that_leaves_mid_stream_frees_every_block_on_both_instances(pair):
    """The client closes a split stream: the proxy closes its upstream, the decode instance aborts
    the request and frees its blocks (the pulled prompt's and the generated ones), and the prefill
    instance's hold was already released by the pull."""
    children, proxy = pair
    stream = client_for(proxy.url, "outer").completions.create(
        model=NAME, prompt=PROMPTS[1], max_tokens=3000, temperature=0, stream=True, extra_body={"ignore_eos": True})
    chunks = iter(stream)
    for _ in range(3):
        next(chunks)
    assert metric(children.urls[1], children.key, "vllm:kv_cache_usage_perc") > 0  # the stream's blocks
    stream.close()
    for url in children.urls:
        deadline = time.monotonic() + 15
        while metric(url, children.key, "vllm:kv_cache_usage_perc") > 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert metric(url, children.key, "vllm:kv_cache_usage_perc") == 0, url


def test_killing_the_decode_instance_mid_stream_fails_only_that_request(pair):
    children, proxy = pair
    split = client_for(proxy.url, "outer")
    stream = split.completions.create(model=NAME, prompt=PROMPTS[1], max_tokens=3000, temperature=0, stream=True,
                                      extra_body={"ignore_eos": True})
    received = [next(iter(stream)).choices[0].text for _ in range(3)]
    children.procs[1].kill()
    with pytest.raises(openai.APIError, match="decode instance failed"):
        for chunk in stream:
            received.append(chunk.choices[0].text)
    assert len(received) < 3000
    assert_prefill_blocks_free_and_decode_out(children.urls[0], children.key, proxy.url)
    assert complete(split, "Still there?", 4, True)  # whole on the prefill instance meanwhile


def test_a_killed_instance_is_started_again(pair):
    """The test above killed the decode instance: the launcher started it again on its port, and
    split requests go through it again (one engine's answers). The prefill instance is restarted
    by the same code; its new pool's mapping is tested in test_llm_parallel_kv_connector.py."""
    children, _ = pair
    wait_until_healthy(children.urls[1], children.key)
    assert children.procs[1].poll() is None  # a new process: the killed one's poll() is -9
    assert metric(children.urls[1], children.key, "vllm:kv_cache_usage_perc") == 0
    proxy = start_server(create_disagg_app(children.urls[0], children.urls[1], frozenset({"outer"}), children.key))
    try:
        whole = complete(client_for(children.urls[0], children.key), PROMPTS[2], 5, True)
        assert complete(client_for(proxy.url, "outer"), PROMPTS[2], 5, True) == whole
        assert metric(children.urls[1], children.key, "vllm:prompt_tokens_total") > 0  # the new decode side ran it
    finally:
        proxy.stop()


def wait_until_healthy(url: str, key: str, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", headers={"Authorization": f"Bearer {key}"}, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not come back within {timeout_s} s")


def assert_prefill_blocks_free_and_decode_out(prefill_url: str, key: str, proxy_url: str) -> None:
    """After the decode instance died: the prefill instance frees every pulled block (within its
    idle second) and the proxy counts the decode instance out (also for the pair on Ray)."""
    deadline = time.monotonic() + 15
    while metric(prefill_url, key, "vllm:kv_cache_usage_perc") > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert metric(prefill_url, key, "vllm:kv_cache_usage_perc") == 0
    assert httpx.get(proxy_url + "/health", timeout=10).json()["decode_instance"] == "unreachable"


def test_bad_serving_options_are_exit_2(tiny_chat_model):
    result = subprocess.run([*CODEYARD, "llm", "serve", "--model", str(tiny_chat_model), "--role", "decode"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "--kv-port" in result.stderr
    result = subprocess.run([*CODEYARD, "llm", "serve", "--model", str(tiny_chat_model), "--max-local-prefill-length",
                             "64"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--disaggregated" in result.stderr
    result = subprocess.run([*CODEYARD, "llm", "serve", "--model", str(tiny_chat_model), "--scheduling-policy", "lifo"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "must be fcfs or priority, got 'lifo'" in result.stderr


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_the_proxy_runs_beside_the_prefill_instance_while_the_pair_serves():
    before = os.sched_getaffinity(0)
    prefill_core = {min(before)}
    worker = threading.Thread(target=threading.Event().wait, args=(5,), daemon=True)  # a thread that exists already
    worker.start()
    with proxy_beside_prefill(prefill_core):
        assert all(os.sched_getaffinity(int(task)) == prefill_core for task in os.listdir("/proc/self/task"))
    assert all(os.sched_getaffinity(int(task)) == before for task in os.listdir("/proc/self/task"))
    with proxy_beside_prefill(None):  # not pinned: left alone
        assert os.sched_getaffinity(0) == before


def test_the_decode_engine_has_its_core_alone_and_its_api_process_goes_beside_the_prefill_instance():
    cpus, args = decode_engine_alone([{0}, {2, 3}], ["--role", "decode"])
    assert cpus == [{0}, {0}]  # both instances' processes; the decode one's engine core pins itself
    assert args == ["--role", "decode", "--engine-cpus", "2,3"]


def test_a_child_that_keeps_dying_is_started_again_less_and_less_often(monkeypatch):
    monkeypatch.setattr(Supervisor, "POLL_S", 0.05)
    command = [sys.executable, "-c", "raise SystemExit(3)"]
    procs = [subprocess.Popen(command)]

    def restart(index: int) -> None:
        procs[index] = subprocess.Popen(command)

    supervisor = Supervisor(["flaky"], lambda i: None if procs[i].poll() is None else "exited", restart)
    supervisor.start()
    try:
        deadline = time.monotonic() + 30
        while supervisor.deaths != [2] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert supervisor.deaths == [2] and supervisor.restarts == 1  # the first death: started again at once
        time.sleep(RESTART_DELAYS_S[1] / 2)
        assert supervisor.restarts == 1  # the second: after RESTART_DELAYS_S[1]
    finally:
        supervisor.stop()
    assert procs[0].wait(timeout=30) == 3 and not supervisor.is_alive()
