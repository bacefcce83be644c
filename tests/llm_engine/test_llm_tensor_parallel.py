"""Tensor parallelism on the CPU: tensor_parallel_size=2 (worker processes over gloo) gives the
same greedy tokens as one rank in float32 for each registered architecture, with prefix-cache
hits, and with GQA where the KV heads are fewer than the ranks under preemption. The failure
paths, quantized weights and the real SmolLM2 are in test_llm_tensor_parallel_more.py
(`make test-llm-parallel`).
"""

from __future__ import annotations

import pytest
from conftest import ARCHS, build_tiny_model
from tp_kit import assert_same, engines, mqa_llama, prompts, tokens_and_logprobs  # noqa: F401 (fixtures)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_tp2_matches_one_rank_with_prefix_cache_hits(arch, tmp_path, engines):
    folder = build_tiny_model(arch, tmp_path)
    batch = prompts()
    ref = tokens_and_logprobs(engines(folder), batch)
    tp = engines(folder, tensor_parallel_size=2)
    assert_same(tokens_and_logprobs(tp, batch), ref)
    assert_same(tokens_and_logprobs(tp, batch), ref)  # again: now from the prefix cache
    stats = tp.engine.get_stats()
    assert stats.prefix_cache_hits >= 16 + 32 + 64  # the second pass finds every full block
    assert stats.num_free_blocks == stats.num_total_blocks


def test_gqa_fewer_kv_heads_than_ranks_under_preemption(mqa_llama, engines):
    batch = prompts()
    # 12 blocks of 16 slots cannot hold the batch at once: sequences are preempted and recomputed
    kwargs = dict(num_kv_blocks=12, enable_prefix_caching=True)
    ref = tokens_and_logprobs(engines(mqa_llama, **kwargs), batch)
    tp = engines(mqa_llama, tensor_parallel_size=2, **kwargs)
    assert_same(tokens_and_logprobs(tp, batch), ref)
    assert tp.engine.get_stats().num_preemptions > 0
