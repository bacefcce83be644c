"""Tensor parallelism, the heavier half (`make test-llm-parallel`, CODEYARD_TP_MORE=1): quantized
weights split by whole groups, a bad head split, a killed worker (its requests fail, every block
is freed, the next requests run on a restarted group), and the real SmolLM2 (Q4_1 kept quantized)
on three ranks with preemption and prefix-cache hits. Disaggregated serving: decode instances at
two ranks fed by one rank or two, a KV head both ranks keep (into a split of two ranks and of one),
and a prefill group killed with transfers held (its new pools serve the next ones). Each test
starts worker groups: about 10 s each on an idle 2-core machine.
"""

from __future__ import annotations

import os
import signal

import pytest
from conftest import COMMON, smollm_gguf_path
from test_llm_parallel_kv_connector import GREEDY, KEY, PROMPTS, assert_all_free, decode, prefill
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

from llm_engine import LLM, SamplingParams


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


def one_engines_tokens(folder, prompts: list[list[int]]) -> list[list[int]]:
    llm = LLM(str(folder), dtype="float32", num_kv_blocks=64)
    return [out.outputs[0].token_ids for out in llm.generate(prompts, SamplingParams(**GREEDY), use_tqdm=False)]


def kv_engine(engines, folder, tp: int, producer: LLM | None = None, transport: str = "shm") -> LLM:
    """A prefill engine, or (given its producer) a decode engine pulling from it, of `tp` ranks."""
    kv = ({"kv_role": "kv_producer", "kv_key": KEY} if producer is None else
          {"kv_role": "kv_consumer", "kv_key": KEY, "kv_port": producer.engine.kv_connector.port,
           "kv_transport": transport})
    return engines(folder, tensor_parallel_size=tp, num_kv_blocks=64, kv_transfer_config=kv)


def test_a_tp2_decode_instance_takes_kv_from_either_split(tiny_llama, engines):
    """One KV head per rank: the decode instance's ranks get theirs from one rank's pool (socket)
    or from the prefill instance's two ranks' files (shm); every prompt block pulled."""
    expected = one_engines_tokens(tiny_llama, PROMPTS)
    for producer_tp, transport in ((1, "socket"), (2, "shm")):
        producer = kv_engine(engines, tiny_llama, producer_tp)
        consumer = kv_engine(engines, tiny_llama, 2, producer, transport)
        outs = decode(consumer, PROMPTS, prefill(producer, PROMPTS))
        assert [out.outputs[0].token_ids for out in outs] == expected
        assert consumer.engine.kv_connector.failed_pulls == 0
        assert consumer.engine.kv_connector.blocks_received == sum(-(-(len(p) - 1) // 16) for p in PROMPTS)
        assert_all_free(producer, consumer)


def test_a_kv_head_both_ranks_keep_goes_to_either_split(mqa_llama, engines):
    """One KV head for two ranks: each rank's pool holds a copy, the producer offers one, and each
    consumer rank (or the one rank) gets it."""
    expected = one_engines_tokens(mqa_llama, PROMPTS)
    producer = kv_engine(engines, mqa_llama, 2)
    assert [(s.first_head, s.pool.shape[3]) for s in producer.engine.kv_connector.shards] == [(0, 1), (0, 1)]
    for consumer in (kv_engine(engines, mqa_llama, 2, producer), kv_engine(engines, mqa_llama, 1, producer, "socket")):
        outs = decode(consumer, PROMPTS, prefill(producer, PROMPTS))
        assert [out.outputs[0].token_ids for out in outs] == expected
        assert consumer.engine.kv_connector.failed_pulls == 0 and consumer.engine.kv_connector.blocks_received > 0
        assert_all_free(producer, consumer)


def test_restarted_groups_hand_over_their_new_pools(tiny_llama, engines):
    """A prefill rank killed while transfers are held: their blocks are freed, their pulls fail (the
    decode side computes those prompts), and the next transfers come from the new ranks' pools,
    not the dead ones' (which the engine still had mapped: wrong tokens, silently). A decode rank
    killed: the next pulls go into its new ranks' pools."""
    first, after, again = PROMPTS[:3], [[t + 1 for t in p] for p in PROMPTS[3:]], [[t + 2 for t in p] for p in PROMPTS]
    expected = one_engines_tokens(tiny_llama, first + after + again)
    producer = kv_engine(engines, tiny_llama, 2)
    consumer = kv_engine(engines, tiny_llama, 2, producer)
    held = prefill(producer, first)
    old_paths = [s.path for s in producer.engine.kv_connector.shards]
    os.kill(producer.engine.model_runner.pids[1], signal.SIGKILL)
    failed = producer.generate([[9, 8, 7]], SamplingParams(max_tokens=2), use_tqdm=False)[0]
    assert "tensor-parallel rank 1" in failed.error
    assert producer.engine.kv_connector.num_held_blocks() == 0
    assert not {s.path for s in producer.engine.kv_connector.shards} & set(old_paths)
    outs = decode(consumer, first, held)
    assert [out.outputs[0].token_ids for out in outs] == expected[:3]
    assert consumer.engine.kv_connector.failed_pulls == len(first)
    outs = decode(consumer, after, prefill(producer, after))
    assert [out.outputs[0].token_ids for out in outs] == expected[3:len(PROMPTS)]
    assert_all_free(producer, consumer)

    os.kill(consumer.engine.model_runner.pids[0], signal.SIGKILL)
    failed = consumer.generate([[9, 8, 7]], SamplingParams(max_tokens=2), use_tqdm=False)[0]
    assert "tensor-parallel rank 0" in failed.error
    outs = decode(consumer, again, prefill(producer, again))
    assert [out.outputs[0].token_ids for out in outs] == expected[len(PROMPTS):]
    assert consumer.engine.kv_connector.failed_pulls == len(first)  # pulled, not computed here
    assert_all_free(producer, consumer)
