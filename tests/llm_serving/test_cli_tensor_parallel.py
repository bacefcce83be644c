"""`codeyard llm serve --tensor-parallel-size 2` as users run it, alone and with --disaggregated
(under `make test-llm-parallel`)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import openai

from .conftest import free_port
from .test_cli import CODEYARD, wait_healthy


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _ranks_under(pid: int) -> list[int]:
    """The tensor-parallel worker processes among `pid`'s descendants."""
    ranks = []
    for kid in _children(pid):
        try:
            is_rank = b"llm_engine.worker" in Path(f"/proc/{kid}/cmdline").read_bytes()
        except OSError:
            continue
        ranks += [kid] if is_rank else _ranks_under(kid)
    return ranks


def test_serve_with_two_tensor_parallel_ranks(tiny_chat_model):
    """Same greedy completion as one rank; the workers end with the server."""
    from llm_engine import LLM, SamplingParams

    port = free_port()
    proc = subprocess.Popen([*CODEYARD, "llm", "serve", "--model", str(tiny_chat_model), "--port", str(port),
                             "--served-model-name", "tiny", "--tensor-parallel-size", "2", "--kv-cache-memory",
                             "16MiB"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(proc, port, 300)
        workers = _ranks_under(proc.pid)  # under the engine's own process (--engine-process, the default)
        assert len(workers) == 2
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        out = client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=8, temperature=0,
                                        extra_body={"ignore_eos": True})
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    one_rank = LLM(str(tiny_chat_model), kv_cache_memory="16MiB").generate(
        "def add(a, b):", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)[0]
    assert out.choices[0].text == one_rank.outputs[0].text
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers), "a worker outlived the server"


def test_disaggregated_serving_with_two_ranks_per_instance(tiny_chat_model):
    """`--disaggregated --tensor-parallel-size 2`: the prefill and the decode instance each split over
    two ranks, the KV going from the prefill ranks' pools to the decode ranks'; one rank's greedy
    completions, and no pull failed (a failed one is computed on the decode side, and logged)."""
    from llm_engine import LLM, SamplingParams

    prompts = ["def add(a, b):", "The quick brown fox " * 12]
    port = free_port()
    proc = subprocess.Popen([*CODEYARD, "llm", "serve", "--model", str(tiny_chat_model), "--port", str(port),
                             "--served-model-name", "tiny", "--disaggregated", "--tensor-parallel-size", "2",
                             "--kv-cache-memory", "16MiB"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(proc, port, 600)
        servers = _children(proc.pid)
        assert len(servers) == 2 and all(len(_ranks_under(pid)) == 2 for pid in servers)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
        texts = [client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0,
                                           extra_body={"ignore_eos": True}).choices[0].text for prompt in prompts]
    finally:
        proc.terminate()
        log = proc.communicate(timeout=60)[0]
    one_rank = LLM(str(tiny_chat_model), kv_cache_memory="16MiB").generate(
        prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert texts == [out.outputs[0].text for out in one_rank]
    assert "KV transfer failed" not in log
