"""Paged pool bookkeeping: ref counts, chained-hash prefix cache, collision guard, LRU, forks."""

from __future__ import annotations

import llm_engine.block_manager as block_manager_module
from llm_engine.block_manager import BlockManager, hash_block
from llm_engine.sampling_params import SamplingParams
from llm_engine.sequence import Request

BS = 4


def make_seq(tokens: list[int], n: int = 1):
    return Request(f"r{id(tokens)}", None, tokens, SamplingParams(n=n)).seqs[0]


def compute_all(bm: BlockManager, seq) -> None:
    """Allocate and 'compute' every token of seq, as a prefill step would."""
    cached = bm.find_cached_prefix(seq)
    assert bm.allocate_slots(seq, seq.num_tokens - len(cached) * BS, cached) is not None
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_full_blocks(seq)


def test_allocation_and_free_return_every_block():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    seq = make_seq(list(range(10)))
    assert bm.allocate_slots(seq, 10) == []
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 5
    assert bm.allocate_slots(seq, 100) is None  # too big: nothing changes
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 5
    bm.free(seq)
    assert seq.block_table == [] and bm.num_free_blocks == 8


def test_hash_chain_depends_on_every_earlier_token():
    first = hash_block(None, (1, 2, 3, 4))
    assert hash_block(first, (5, 6, 7, 8)) != hash_block(hash_block(None, (9, 2, 3, 4)), (5, 6, 7, 8))
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    compute_all(bm, a)
    same_second_block = make_seq([9, 2, 3, 4, 5, 6, 7, 8, 9])
    assert bm.find_cached_prefix(same_second_block) == []
    sharing = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 10, 11])
    assert bm.find_cached_prefix(sharing) == a.block_table[:2]


def test_prefix_hit_shares_blocks_with_ref_counts():
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a = make_seq(list(range(12)))
    compute_all(bm, a)
    b = make_seq(list(range(8)) + [50, 51, 52])
    compute_all(bm, b)
    assert b.block_table[:2] == a.block_table[:2]
    assert [bm.blocks[i].ref_count for i in a.block_table] == [2, 2, 1]
    bm.free(a)
    assert [bm.blocks[i].ref_count for i in b.block_table[:2]] == [1, 1]
    bm.free(b)
    assert bm.num_free_blocks == 16


def test_at_least_one_token_is_left_to_compute():
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a = make_seq(list(range(8)))
    compute_all(bm, a)
    again = make_seq(list(range(8)))
    assert bm.find_cached_prefix(again) == a.block_table[:1]


def test_collision_guard_compares_token_ids(monkeypatch):
    monkeypatch.setattr(block_manager_module, "hash_block", lambda parent, tokens: 42)
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a = make_seq([1, 2, 3, 4, 5])
    compute_all(bm, a)
    other = make_seq([7, 7, 7, 7, 5])  # same (forced) hash, different tokens
    assert bm.find_cached_prefix(other) == []
    compute_all(bm, other)
    assert other.block_table[0] != a.block_table[0]
    assert bm.find_cached_prefix(make_seq([1, 2, 3, 4, 9])) == a.block_table[:1]


def test_free_cached_blocks_are_evicted_least_recently_used_and_after_uncached():
    bm = BlockManager(4, BS, enable_prefix_caching=True)
    old, new = make_seq([1, 1, 1, 1, 0]), make_seq([2, 2, 2, 2, 0])
    compute_all(bm, old)
    compute_all(bm, new)
    bm.free(old)
    bm.free(new)
    assert bm.num_free_blocks == 4
    # Two uncached blocks are handed out before any cached one.
    filler = make_seq([9] * 8)
    assert bm.allocate_slots(filler, 8) is not None
    assert bm.find_cached_prefix(make_seq([1, 1, 1, 1, 0])) != []
    # The next allocation must evict: the least recently freed cached block goes first.
    one_more = make_seq([8] * 4)
    assert bm.allocate_slots(one_more, 4) is not None
    assert bm.find_cached_prefix(make_seq([1, 1, 1, 1, 0])) == []
    assert bm.find_cached_prefix(make_seq([2, 2, 2, 2, 0])) != []


def test_reusing_a_free_cached_block_counts_against_free_space():
    bm = BlockManager(3, BS, enable_prefix_caching=True)
    a = make_seq([1, 2, 3, 4, 5])
    compute_all(bm, a)
    bm.free(a)
    b = make_seq([1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14])
    cached = bm.find_cached_prefix(b)
    assert len(cached) == 1
    assert bm.allocate_slots(b, 9, cached) is None  # 1 revived + 3 new > 3 free
    assert bm.num_free_blocks == 3 and bm.blocks[cached[0]].ref_count == 0


def test_fork_shares_blocks_and_copies_partial_block_on_write():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    parent = make_seq(list(range(6)), n=2)
    assert bm.allocate_slots(parent, 6) == []
    parent.num_computed_tokens = 6
    child = parent.fork(1)
    bm.fork(parent, child)
    assert child.block_table == parent.block_table
    assert all(bm.blocks[b].ref_count == 2 for b in parent.block_table)
    parent.token_ids.append(100)
    child.token_ids.append(200)
    copies = bm.allocate_slots(child, 1)
    assert copies == [(parent.block_table[1], child.block_table[1])]
    assert child.block_table[0] == parent.block_table[0]
    assert bm.allocate_slots(parent, 1) == []  # parent now owns its block alone
    bm.free(parent)
    bm.free(child)
    assert bm.num_free_blocks == 8


def test_prefix_cache_statistics():
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    bm.record_prefix_lookup(10, 8)
    assert (bm.prefix_queries, bm.prefix_hits) == (10, 8)
    assert bm.usage == 0.0
    seq = make_seq(list(range(8)))
    assert bm.allocate_slots(seq, 8) == []
    assert bm.usage == 0.25
