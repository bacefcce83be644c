"""Token-budget scheduling: budget and max_num_seqs, chunked prefill, priority, preemption."""

from __future__ import annotations

from llm_engine.block_manager import BlockManager
from llm_engine.config import EngineConfig
from llm_engine.sampling_params import SamplingParams
from llm_engine.scheduler import Scheduler
from llm_engine.sequence import Request, SequenceStatus

BS = 4


def make_scheduler(num_blocks=64, budget=32, max_seqs=8, policy="fcfs", caching=False):
    config = EngineConfig(model="unused", block_size=BS, max_num_batched_tokens=budget,
                          max_num_seqs=max_seqs, scheduling_policy=policy)
    return Scheduler(config, BlockManager(num_blocks, BS, caching))


def add(sched, num_tokens, priority=0, arrival=0.0, name=None):
    request = Request(name or f"r{arrival}-{priority}-{num_tokens}", None, list(range(1, num_tokens + 1)),
                      SamplingParams(), priority, arrival, use_priority=sched.policy == "priority")
    sched.add(request.seqs[0])
    return request.seqs[0]


def finish_step(sched, out):
    """Pretend the model ran: advance computed tokens and append a token where a prefill ended."""
    for seq, n in out.scheduled:
        seq.num_computed_tokens += n
        sched.block_manager.cache_full_blocks(seq)
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(7)


def test_budget_chunks_long_prompts_and_mixes_decodes():
    sched = make_scheduler(budget=32)
    a = add(sched, 20, arrival=1)
    add(sched, 50, arrival=2)
    out = sched.schedule()
    assert [(s is a, n) for s, n in out.scheduled] == [(True, 20), (False, 12)]
    finish_step(sched, out)
    out = sched.schedule()  # a decodes, b continues its prefill in the same step
    assert [(s is a, n) for s, n in out.scheduled] == [(True, 1), (False, 31)]
    assert out.num_batched_tokens <= 32


def test_max_num_seqs_limits_running():
    sched = make_scheduler(budget=100, max_seqs=2)
    seqs = [add(sched, 5, arrival=i) for i in range(4)]
    out = sched.schedule()
    assert [s for s, _ in out.scheduled] == seqs[:2]
    assert sched.num_running == 2 and sched.num_waiting == 2


def test_priority_policy_orders_waiting_by_priority_then_arrival():
    sched = make_scheduler(budget=10, max_seqs=8, policy="priority")
    low = add(sched, 10, priority=5, arrival=1)
    high = add(sched, 10, priority=0, arrival=2)
    mid = add(sched, 10, priority=1, arrival=0)
    order = []
    for _ in range(3):
        out = sched.schedule()
        order += [s for s, n in out.scheduled if s.num_computed_tokens == 0]
        finish_step(sched, out)
    assert order[:3] == [high, mid, low]


def test_priority_policy_puts_a_waiting_higher_priority_prompt_before_a_running_prompts_chunks():
    """A short prompt (priority = its length, as a disaggregated prefill instance's proxy sets it)
    that arrives while a long prompt is being chunked runs in the next step, and the long prompt
    takes what budget it leaves; it no longer waits for the long prompt's every chunk."""
    sched = make_scheduler(num_blocks=256, budget=32, policy="priority")
    long = add(sched, 200, priority=200, arrival=1)
    out = sched.schedule()
    assert out.scheduled == [(long, 32)]
    finish_step(sched, out)
    short = add(sched, 10, priority=10, arrival=2)
    out = sched.schedule()
    assert out.scheduled == [(short, 10), (long, 22)]
    finish_step(sched, out)
    out = sched.schedule()  # the short one decodes first, the long prompt goes on with the rest
    assert out.scheduled == [(short, 1), (long, 31)]


def test_a_deferred_prompt_chunk_never_preempts_the_requests_admitted_before_it():
    sched = make_scheduler(num_blocks=14, budget=32, policy="priority")
    long = add(sched, 76, priority=76, arrival=1)
    finish_step(sched, sched.schedule())  # 32 tokens: 8 blocks
    short = add(sched, 8, priority=8, arrival=2)  # 2 blocks, then 4 free: the long chunk (24) needs 6
    out = sched.schedule()
    assert out.scheduled == [(short, 8)] and not out.preempted
    assert long.status is SequenceStatus.RUNNING and short.status is SequenceStatus.RUNNING


def test_fcfs_keeps_a_running_prompts_chunks_first():
    sched = make_scheduler(num_blocks=256, budget=32, policy="fcfs")
    long = add(sched, 200, arrival=1)
    finish_step(sched, sched.schedule())
    add(sched, 10, arrival=2)
    assert sched.schedule().scheduled == [(long, 32)]


def test_fcfs_ignores_priority():
    sched = make_scheduler(budget=10, policy="fcfs")
    first = add(sched, 10, priority=9, arrival=1)
    add(sched, 10, priority=0, arrival=2)
    assert sched.schedule().scheduled[0][0] is first


def test_preemption_frees_newest_and_recomputes_later():
    sched = make_scheduler(num_blocks=4, budget=64)
    old = add(sched, 8, arrival=1)  # 2 blocks
    new = add(sched, 8, arrival=2)  # 2 blocks: the pool is full
    out = sched.schedule()
    assert len(out.scheduled) == 2
    finish_step(sched, out)  # both now need a third block for their next token
    out = sched.schedule()
    assert out.preempted == [new]
    assert new.status is SequenceStatus.PREEMPTED and new.block_table == [] and new.num_computed_tokens == 0
    assert new.request.metrics.num_preemptions == 1
    assert [s for s, _ in out.scheduled] == [old]
    sched.finish(old, SequenceStatus.FINISHED_STOPPED)
    out = sched.schedule()  # recomputed from all its tokens, prompt and output
    assert out.scheduled == [(new, 9)]
    assert new.status is SequenceStatus.RUNNING


def test_preempted_sequence_reuses_its_cached_prefix():
    sched = make_scheduler(num_blocks=5, budget=64, caching=True)
    old = add(sched, 8, arrival=1)
    new = add(sched, 9, arrival=2)
    finish_step(sched, sched.schedule())
    sched.finish(old, SequenceStatus.FINISHED_STOPPED)
    out = sched.schedule()
    assert [s for s, _ in out.scheduled] == [new]
    sched.preempt(new)
    out = sched.schedule()
    assert out.scheduled == [(new, 10 - 8)]  # two full blocks came back from the prefix cache


def test_priority_policy_preempts_lower_priority_running_for_a_waiting_request():
    sched = make_scheduler(budget=64, max_seqs=2, policy="priority")
    low_old = add(sched, 6, priority=5, arrival=1)
    low_new = add(sched, 6, priority=5, arrival=2)
    finish_step(sched, sched.schedule())
    urgent = add(sched, 6, priority=0, arrival=3)
    out = sched.schedule()
    assert out.preempted == [low_new]  # the lowest priority, newest one makes room
    assert low_new.status is SequenceStatus.PREEMPTED and low_new.block_table == []
    assert [s for s, _ in out.scheduled] == [low_old, urgent]
    assert sched.waiting == [low_new]


def test_priority_preemption_when_blocks_run_out_gives_back_the_victims_budget():
    sched = make_scheduler(num_blocks=4, budget=64, max_seqs=8, policy="priority")
    low = add(sched, 12, priority=3, arrival=1)  # 3 of the 4 blocks
    finish_step(sched, sched.schedule())
    urgent = add(sched, 8, priority=1, arrival=2)  # needs 2 blocks: only 1 is free
    out = sched.schedule()
    assert out.preempted == [low]
    assert out.scheduled == [(urgent, 8)]
    assert sched.block_manager.num_free_blocks == 2


def test_fcfs_and_equal_priorities_never_preempt_for_waiting_requests():
    for policy, urgent_priority in (("fcfs", 0), ("priority", 5)):
        sched = make_scheduler(budget=64, max_seqs=1, policy=policy)
        running = add(sched, 6, priority=5, arrival=1)
        finish_step(sched, sched.schedule())
        add(sched, 6, priority=urgent_priority, arrival=2)
        out = sched.schedule()
        assert out.preempted == [] and [s for s, _ in out.scheduled] == [running]
