"""500 requests with random lengths, priorities, aborts and timeouts on a small KV pool."""

from __future__ import annotations

import random

from conftest import VOCAB

from llm_engine import LLMEngine, SamplingParams

TERMINAL_REASONS = {"stop", "length", "abort", "error"}


def test_engine_keeps_serving_and_returns_every_block(tiny_llama):
    engine = LLMEngine.from_kwargs(model=str(tiny_llama), dtype="float32", block_size=8, num_kv_blocks=40,
                                   max_num_seqs=24, max_num_batched_tokens=96, scheduling_policy="priority")
    rng = random.Random(2024)
    pending = list(range(500))
    finished: dict[str, object] = {}
    added: set[str] = set()
    steps = 0
    while pending or engine.has_unfinished_requests():
        for _ in range(rng.randint(0, 6)):
            if not pending:
                break
            i = pending.pop(0)
            length = rng.choice([rng.randint(1, 30), rng.randint(30, 200), 400])  # 400 > pool: ignored
            params = SamplingParams(
                temperature=rng.choice([0.0, 0.7, 1.0]), seed=rng.choice([None, i]),
                max_tokens=rng.randint(1, 24), ignore_eos=rng.random() < 0.5,
                n=rng.choice([1, 1, 1, 2]), top_p=rng.choice([1.0, 0.9]),
                timeout=rng.choice([None] * 9 + [rng.uniform(0.001, 0.2)]))
            engine.add_request(f"r{i}", [rng.randrange(3, VOCAB) for _ in range(length)], params,
                               priority=rng.randint(0, 3))
            added.add(f"r{i}")
        if engine.requests and rng.random() < 0.15:
            engine.abort_request(rng.choice(sorted(engine.requests)))
        for out in engine.step():
            if out.finished:
                assert out.request_id not in finished, f"{out.request_id} finished twice"
                finished[out.request_id] = out
        steps += 1
        assert steps < 20000
    assert set(finished) == added
    reasons = [c.finish_reason for out in finished.values() for c in out.outputs]
    assert set(reasons) <= TERMINAL_REASONS
    assert {"stop", "length", "abort"} <= set(reasons)
    assert any(out.error and "prompt is" in out.error for out in finished.values())
    assert any(c.stop_reason == "timeout" for out in finished.values() for c in out.outputs)
    stats = engine.get_stats()
    assert stats.num_preemptions > 0
    assert stats.num_free_blocks == stats.num_total_blocks
    assert stats.num_running == stats.num_waiting == 0
    assert all(block.ref_count == 0 for block in engine.block_manager.blocks)
