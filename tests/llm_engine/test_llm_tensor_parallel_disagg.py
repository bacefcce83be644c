"""Tensor parallelism inside disaggregated serving: a prefill instance at tensor_parallel_size=2
(each rank's KV pool a file its engine maps, holding that rank's KV head) hands its KV to a
one-rank decode instance over shared memory and the socket: one engine's greedy tokens, every
prompt block pulled, every block freed on both sides. The copy between any two splits of the
heads, and the options. The heavier cases (decode instances at TP=2, a KV head kept by both
ranks, a restarted prefill group, the CLI's --disaggregated at TP=2) are in
test_llm_tensor_parallel_more.py and test_cli_tensor_parallel.py (`make test-llm-parallel`):
each worker group costs seconds."""

from __future__ import annotations

import os

import pytest
import torch
import typer
from test_llm_parallel_kv_connector import (  # noqa: F401 (expected: a fixture)
    BS,
    KEY,
    PROMPTS,
    assert_all_free,
    consumer_for,
    decode,
    expected,
    prefill,
)

from llm_engine import LLM
from llm_engine.cli import check_disaggregation
from llm_engine.entrypoints.disagg_servers import instance_cores
from llm_engine.kv_connector import KVShard, copy_heads


@pytest.fixture(scope="module")
def producer(tiny_llama):
    """tiny_llama has 2 KV heads: one on each rank at TP=2."""
    llm = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=64, tensor_parallel_size=2,
              kv_transfer_config={"kv_role": "kv_producer", "kv_key": KEY})
    yield llm
    llm.engine.shutdown()


def test_copy_heads_moves_any_split_of_the_heads_into_any_other():
    whole = torch.randn(2, 3, 10, 4, 2, 8)  # 4 KV heads
    halves = [KVShard(whole[:, :, :, :2].clone(), 0), KVShard(whole[:, :, :, 2:].clone(), 2)]
    src_ids, dst_ids = [4, 5, 9], [1, 2, 7]
    one = KVShard(torch.zeros_like(whole))
    copy_heads([one], dst_ids, halves, src_ids)
    assert torch.equal(one.pool[:, :, dst_ids], whole[:, :, src_ids]) and one.pool[:, :, 0].abs().sum() == 0
    quarters = [KVShard(torch.zeros(2, 3, 10, 1, 2, 8), head) for head in range(4)]
    copy_heads(quarters, dst_ids, [one], dst_ids)
    assert all(torch.equal(q.pool[:, :, dst_ids, 0], whole[:, :, src_ids, q.first_head]) for q in quarters)


@pytest.mark.parametrize("transport", ["shm", "socket"])
def test_a_tp2_prefill_instance_gives_one_engines_tokens(transport, tiny_llama, producer, expected):
    consumer = consumer_for(tiny_llama, producer, kv_transport=transport)
    outs = decode(consumer, PROMPTS, prefill(producer, PROMPTS))
    assert [out.outputs[0].token_ids for out in outs] == expected
    assert all(out.error is None for out in outs)
    assert consumer.engine.kv_connector.failed_pulls == 0
    assert consumer.engine.kv_connector.blocks_received == sum(-(-(len(p) - 1) // BS) for p in PROMPTS)
    assert_all_free(producer, consumer)
    assert producer.engine.kv_connector.num_held_blocks() == 0


def test_each_rank_shares_its_own_heads(producer):
    shards = producer.engine.kv_connector.shards
    assert [(s.first_head, s.pool.shape[3]) for s in shards] == [(0, 1), (1, 1)]
    assert all(s.path is not None and s.path.exists() for s in shards)  # the ranks' files, mapped here


def test_a_disaggregated_instances_ranks_are_local_processes_with_cores_of_their_own(monkeypatch):
    with pytest.raises(typer.BadParameter, match="local processes"):
        check_disaggregation(True, None, None, "shm", 1, 2, "ray")
    check_disaggregation(True, None, None, "shm", 1, 2, "mp")
    check_disaggregation(False, "decode", 4000, "socket", 1, 2, "mp")
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1, 2, 3, 4})
    assert instance_cores(True, per_instance=2) == [{0, 1}, {2, 3}]
    assert instance_cores(True, per_instance=3) == [{0}, {1}]  # too few for three each: one each
