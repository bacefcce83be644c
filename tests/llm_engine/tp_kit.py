"""Shared by the tensor-parallel tests: the prompts, the comparison with one rank, and an
`engines` fixture that shuts every engine's workers down after a test and fails it if one survives."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
import torch
from conftest import COMMON, VOCAB
from transformers import AutoModelForCausalLM, LlamaConfig

from llm_engine import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)


def prompts() -> list[list[int]]:
    rng = random.Random(11)
    out = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (5, 17, 40, 1, 33)]
    out[4] = out[2][:32] + out[4]  # shares two full blocks with prompt 2
    return out


def tokens_and_logprobs(llm: LLM, batch: list[list[int]], params: SamplingParams = GREEDY):
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in llm.generate(batch, params, use_tqdm=False)]


def assert_same(ours, ref, atol: float = 1e-4) -> None:
    for i, ((tokens, logprobs), (ref_tokens, ref_logprobs)) in enumerate(zip(ours, ref)):
        assert tokens == ref_tokens, f"prompt {i}: tokens differ\ntp {tokens}\nref {ref_tokens}"
        for token, top, ref_top in zip(tokens, logprobs, ref_logprobs):
            assert abs(top[token].logprob - ref_top[token].logprob) < atol


def kill_rank_one_mid_run(engine, batch: list[list[int]], timeout_s: float) -> list[int]:
    """Start three long requests, SIGKILL rank 1 after two steps, and check what must follow: all
    three end with an error naming the dead rank and every block is free. Returns the old pids."""
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    for i, prompt in enumerate(batch[:3]):
        engine.add_request(f"r{i}", prompt, long)
    engine.step()
    engine.step()
    old = engine.model_runner.pids
    os.kill(old[1], signal.SIGKILL)
    finished = {}
    deadline = time.monotonic() + timeout_s
    while engine.has_unfinished_requests() and time.monotonic() < deadline:
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    assert sorted(finished) == ["r0", "r1", "r2"]
    for output in finished.values():
        assert output.outputs[0].finish_reason == "error"
        assert "tensor-parallel rank 1" in output.error and "died" in output.error
    stats = engine.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    return old


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class Engines:
    """Tensor-parallel LLMs made in a test, shut down (and their workers checked gone) after it."""

    def __init__(self) -> None:
        self.made: list[LLM] = []

    def __call__(self, folder, **kwargs) -> LLM:
        llm = LLM(str(folder), dtype="float32", **{"kv_cache_memory": "8MiB", **kwargs})
        self.made.append(llm)
        return llm

    def close(self) -> None:
        pids = [pid for llm in self.made for pid in getattr(llm.engine.model_runner, "pids", [])]
        for llm in self.made:
            llm.engine.shutdown()
        for pid in pids:  # shutdown reaped them; a survivor is killed and fails the test
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"worker {pid} outlived shutdown")


@pytest.fixture
def engines():
    made = Engines()
    yield made
    made.close()


@pytest.fixture(scope="module")
def mqa_llama(tmp_path_factory):
    """One KV head for two ranks (each rank keeps a copy), four query heads."""
    config = LlamaConfig(**{**COMMON, "num_key_value_heads": 1}, tie_word_embeddings=False)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(99)
    folder = tmp_path_factory.mktemp("mqa-llama")
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    return folder
