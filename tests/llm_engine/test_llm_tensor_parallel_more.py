"""Tensor parallelism, the heavier half (`make test-llm-parallel`, CODEYARD_TP_MORE=1): quantized
weights split by whole groups, a bad head split, a killed worker (its requests fail, every block
is freed, the next requests run on a restarted group), and the real SmolLM2 (Q4_1 kept quantized)
on three ranks with preemption and prefix-cache hits. Each test starts worker groups: about 10 s
each on an idle 2-core machine.
"""

from __future__ import annotations

import pytest
from conftest import COMMON, smollm_gguf_path
from tp_kit import (  # noqa: F401 (fixtures)
    assert_same,
    engines,
    gone,
    kill_rank_one_mid_run,
    mqa_llama,
    prompts,
    tokens_and_logprobs,
)
from transformers import AutoModelForCausalLM, LlamaConfig


def test_quantized_weights_split_by_groups(mqa_llama, engines):
    """int4 in groups of 32: the row-parallel shards (32 and 64 inputs) hold whole groups, so each
    rank rounds exactly the weights one rank would."""
    scheme = {"method": "int4", "group_size": 32, "symmetric": False}
    ref = tokens_and_logprobs(engines(mqa_llama, quantization=scheme), prompts())
    assert_same(tokens_and_logprobs(engines(mqa_llama, quantization=scheme, tensor_parallel_size=2),
                                    prompts()), ref, atol=1e-3)


def test_heads_that_do_not_split_are_a_clear_error(tmp_path, engines):
    config = LlamaConfig(**{**COMMON, "hidden_size": 48, "num_attention_heads": 3, "num_key_value_heads": 3})
    config.architectures = ["LlamaForCausalLM"]
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="3 attention heads and 3 KV heads do not split evenly across 2"):
        engines(tmp_path, tensor_parallel_size=2)


def test_killed_worker_fails_its_requests_and_the_group_restarts(mqa_llama, engines):
    batch = prompts()
    ref = tokens_and_logprobs(engines(mqa_llama), batch[:2])
    tp = engines(mqa_llama, tensor_parallel_size=2)
    engine = tp.engine
    old = kill_rank_one_mid_run(engine, batch, timeout_s=120)
    assert all(gone(pid) for pid in old)
    assert sorted(engine.model_runner.pids) != sorted(old)
    assert_same(tokens_and_logprobs(tp, batch[:2]), ref)  # served by the restarted group


def test_real_smollm2_on_three_ranks_keeps_q4_1_quantized(engines):
    """SmolLM2-135M has 9 heads and 3 KV heads: three ranks, one KV head each; its Q4_1 weights
    are split by whole 32-weight blocks (o_proj 192 and down_proj 512 inputs per rank). The
    pool's blocks cannot hold the batch at once, so sequences are preempted and recomputed, and the
    second pass finds the prompts' full blocks in the prefix cache: one rank's tokens throughout.
    The pools are sized from kv_cache_memory (5 MiB: 7 blocks of float32 KV, a third on each rank)."""
    path = smollm_gguf_path()
    llm = engines(path, kv_cache_memory="5MiB")
    tokenizer = llm.get_tokenizer()
    batch = [tokenizer("def fibonacci(n):").input_ids, tokenizer("The capital of France is").input_ids, *prompts()]
    ref = tokens_and_logprobs(llm, batch)
    tp = engines(path, tensor_parallel_size=3, kv_cache_memory="5MiB")
    assert tp.engine.model_runner.num_blocks == llm.engine.get_stats().num_total_blocks == 7
    assert_same(tokens_and_logprobs(tp, batch), ref, atol=1e-3)
    assert_same(tokens_and_logprobs(tp, batch), ref, atol=1e-3)  # again: now from the prefix cache
    stats = tp.engine.get_stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert stats.num_free_blocks == stats.num_total_blocks
