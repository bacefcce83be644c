"""`codeyard llm serve --tensor-parallel-size 2` as users run it (under `make test-llm-parallel`)."""

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


def test_serve_with_two_tensor_parallel_ranks(tiny_chat_model):
    """Same greedy completion as one rank; the workers end with the server."""
    from llm_engine import LLM, SamplingParams

    port = free_port()
    proc = subprocess.Popen([*CODEYARD, "llm", "serve", "--model", str(tiny_chat_model), "--port", str(port),
                             "--served-model-name", "tiny", "--tensor-parallel-size", "2", "--kv-cache-memory",
                             "16MiB"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(proc, port, 300)
        workers = _children(proc.pid)
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
