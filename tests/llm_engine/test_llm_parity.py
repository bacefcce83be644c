"""Greedy parity with Hugging Face Transformers for every registered architecture.

Each scenario drives the engine through a different path — one request alone, a mixed batch,
prefix-cache hits, chunked prefill, forced preemption — and must produce exactly the tokens
transformers produces (and the same logprobs, within float32 noise). The default attention
backend (the native CPU kernel) runs every scenario; the PyTorch reference runs the batch ones.
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import ARCHS, VOCAB, build_tiny_model, check_logprobs_close, hf_greedy
from transformers import AutoModelForCausalLM

from llm_engine import LLM, SamplingParams

MAX_NEW = 24
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=0)


def mixed_prompts() -> list[list[int]]:
    rng = random.Random(7)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (5, 17, 33, 1, 48, 9, 16, 64)]
    prompts[6] = prompts[2][:32] + prompts[6]  # shares two full blocks with prompt 2
    return prompts


@pytest.fixture(scope="module", params=sorted(ARCHS))
def arch_case(request, tmp_path_factory):
    folder = build_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    prompts = mixed_prompts()
    return folder, prompts, hf_greedy(hf_model, prompts, MAX_NEW)


def run(folder, prompts, **engine_kwargs):
    llm = LLM(model=str(folder), dtype="float32", **engine_kwargs)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    return llm, outputs, [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outputs]


def test_single_requests(arch_case):
    folder, prompts, ref = arch_case
    llm = LLM(model=str(folder), dtype="float32", enable_prefix_caching=False)
    for prompt, expected in zip(prompts[:3], ref[:3]):
        out = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
        assert out.outputs[0].finish_reason == "length"
        check_logprobs_close([(out.outputs[0].token_ids, out.outputs[0].logprobs)], [expected])


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_batch_without_prefix_caching(arch_case, backend):
    folder, prompts, ref = arch_case
    _, _, ours = run(folder, prompts, enable_prefix_caching=False, attention_backend=backend)
    check_logprobs_close(ours, ref)


def test_batch_with_prefix_cache_hits(arch_case):
    folder, prompts, ref = arch_case
    llm, first, ours = run(folder, prompts, enable_prefix_caching=True)
    check_logprobs_close(ours, ref)
    again = llm.generate(prompts, GREEDY, use_tqdm=False)  # same prompts: prefixes come from the cache
    assert sum(o.metrics.num_cached_tokens for o in again) >= 5 * 16
    check_logprobs_close([(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in again], ref)


def test_chunked_prefill(arch_case):
    folder, prompts, ref = arch_case
    _, _, ours = run(folder, prompts, max_num_batched_tokens=16)
    check_logprobs_close(ours, ref)


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_forced_preemption(arch_case, backend):
    folder, prompts, ref = arch_case
    llm, outputs, ours = run(folder, prompts, num_kv_blocks=8, block_size=16, attention_backend=backend)
    assert sum(o.metrics.num_preemptions for o in outputs) > 0
    check_logprobs_close(ours, ref)
    stats = llm.engine.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks
