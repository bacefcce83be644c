"""Request lifecycle: validated transitions, one terminal state each, every block freed."""

from __future__ import annotations

import time

import pytest

from llm_engine import LLM, LLMEngine, SamplingParams, SequenceStatus
from llm_engine.sequence import InvalidTransition, Request


@pytest.fixture()
def engine(tiny_llama):
    return LLMEngine.from_kwargs(model=str(tiny_llama), dtype="float32", block_size=16, num_kv_blocks=16)


def run_to_end(engine: LLMEngine) -> dict:
    finished = {}
    for _ in range(1000):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.finished:
                assert out.request_id not in finished, "a request finished twice"
                finished[out.request_id] = out
    return finished


def assert_all_blocks_free(engine: LLMEngine) -> None:
    stats = engine.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    assert stats.num_running == stats.num_waiting == 0


def test_invalid_transitions_raise():
    seq = Request("r", None, [1, 2], SamplingParams()).seqs[0]
    with pytest.raises(InvalidTransition):
        seq.set_status(SequenceStatus.PREEMPTED)
    seq.set_status(SequenceStatus.RUNNING)
    seq.set_status(SequenceStatus.FINISHED_STOPPED)
    with pytest.raises(InvalidTransition):
        seq.set_status(SequenceStatus.RUNNING)
    with pytest.raises(InvalidTransition):
        seq.set_status(SequenceStatus.FINISHED_ABORTED)


def test_stop_token_finishes_as_stopped(engine):
    engine.add_request("stop", [5, 6, 7], SamplingParams(temperature=0, max_tokens=1))
    first = run_to_end(engine)["stop"].outputs[0].token_ids[0]
    engine.add_request("stop2", [5, 6, 7], SamplingParams(temperature=0, max_tokens=9, stop_token_ids=[first]))
    done = run_to_end(engine)
    assert done["stop2"].outputs[0].finish_reason == "stop"
    assert_all_blocks_free(engine)


def test_length_cap(engine):
    engine.add_request("len", [5, 6, 7], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    out = run_to_end(engine)["len"].outputs[0]
    assert (out.finish_reason, len(out.token_ids)) == ("length", 4)
    assert_all_blocks_free(engine)


def test_too_long_prompt_is_ignored_with_a_clear_error(engine):
    limit = engine.max_model_len
    engine.add_request("long", list(range(3, 3 + limit)), SamplingParams())
    engine.add_request("ok", [3, 4, 5], SamplingParams(max_tokens=2))
    done = run_to_end(engine)
    assert done["long"].outputs[0].finish_reason == "length"
    assert "prompt is" in done["long"].error and str(limit - 1) in done["long"].error
    assert done["long"].outputs[0].token_ids == []
    assert len(done["ok"].outputs[0].token_ids) == 2
    assert_all_blocks_free(engine)


def test_abort_by_id_frees_blocks_immediately(engine):
    engine.add_request("a", list(range(3, 40)), SamplingParams(max_tokens=50, ignore_eos=True))
    engine.add_request("b", list(range(3, 20)), SamplingParams(max_tokens=5, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.get_stats().num_free_blocks < engine.get_stats().num_total_blocks
    engine.abort_request("a")
    b = engine.requests["b"].seqs[0]
    stats = engine.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks - len(b.block_table)
    assert engine.kv_cache_occupancy() == (16 * len(b.block_table), b.num_computed_tokens)
    done = run_to_end(engine)
    assert done["a"].outputs[0].finish_reason == "abort"
    assert 0 < len(done["a"].outputs[0].token_ids) < 50
    assert done["b"].outputs[0].finish_reason == "length"
    engine.abort_request("no-such-request")  # unknown ids are ignored
    assert_all_blocks_free(engine)


def test_timeout_aborts(engine):
    engine.add_request("slow", [3, 4, 5], SamplingParams(max_tokens=200, ignore_eos=True, timeout=0.05))
    engine.step()
    time.sleep(0.06)
    done = run_to_end(engine)
    out = done["slow"].outputs[0]
    assert (out.finish_reason, out.stop_reason) == ("abort", "timeout")
    assert_all_blocks_free(engine)


def test_model_failure_ends_batch_with_error_and_engine_keeps_serving(engine, monkeypatch):
    engine.add_request("doomed", [3, 4, 5], SamplingParams(max_tokens=5))
    original = engine.model_runner.execute

    def broken(*args, **kwargs):
        raise RuntimeError("device fell over")

    monkeypatch.setattr(engine.model_runner, "execute", broken)
    done = run_to_end(engine)
    assert done["doomed"].outputs[0].finish_reason == "error"
    assert "device fell over" in done["doomed"].error
    assert_all_blocks_free(engine)
    monkeypatch.setattr(engine.model_runner, "execute", original)
    engine.add_request("fine", [3, 4, 5], SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(run_to_end(engine)["fine"].outputs[0].token_ids) == 3


def test_bad_requests_raise_value_errors_naming_the_field(engine):
    with pytest.raises(ValueError, match="^prompt:"):
        engine.add_request("empty", [], SamplingParams())
    with pytest.raises(ValueError, match="^prompt:"):
        engine.add_request("vocab", [10**6], SamplingParams())
    with pytest.raises(ValueError, match="^prompt:"):
        engine.add_request("text", "no tokenizer here", SamplingParams())
    with pytest.raises(ValueError, match="^stop:"):
        engine.add_request("stop", [3], SamplingParams(stop="x"))
    engine.add_request("dup", [3], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="^request_id:"):
        engine.add_request("dup", [3], SamplingParams())
    run_to_end(engine)
    assert_all_blocks_free(engine)


def test_engine_config_errors_name_the_field(tiny_llama):
    with pytest.raises(ValueError, match="^scheduling_policy:"):
        LLM(model=str(tiny_llama), scheduling_policy="random")
    with pytest.raises(ValueError, match="^kv_cache_memory:"):
        LLM(model=str(tiny_llama), kv_cache_memory="lots")
    with pytest.raises(ValueError, match="^model:"):
        LLM(model="/nonexistent/model")
    with pytest.raises(ValueError, match="^block_size:"):
        LLM(model=str(tiny_llama), block_size=0)


def test_metrics_are_recorded(tiny_llama):
    llm = LLM(model=str(tiny_llama), dtype="float32")
    out = llm.generate([3, 4, 5, 6], SamplingParams(max_tokens=5, ignore_eos=True), use_tqdm=False)[0]
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.last_token_time <= m.finished_time
    assert len(m.inter_token_latencies) == 4 and m.time_in_queue >= 0 and m.ttft > 0
    stats = llm.engine.get_stats()
    assert stats.prompt_tokens_total == 4 and stats.generation_tokens_total == 5
    assert stats.finished_by_reason == {"length": 1}


def test_prompt_prefilled_over_many_steps_without_logits(tiny_llama):
    prompt = list(range(3, 33))
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    whole = LLM(model=str(tiny_llama), dtype="float32").generate(prompt, params, use_tqdm=False)[0]
    chunked = LLM(model=str(tiny_llama), dtype="float32", max_num_batched_tokens=4)
    out = chunked.generate(prompt, params, use_tqdm=False)[0]
    assert out.error is None
    assert out.outputs[0].token_ids == whole.outputs[0].token_ids


def test_waiting_high_priority_request_preempts_lower_priority_running_ones(tiny_llama):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = {"low-a": [5, 6, 7, 8], "low-b": [9, 10, 11], "urgent": [12, 13, 14, 15, 16]}
    alone = LLM(model=str(tiny_llama), dtype="float32").generate(list(prompts.values()), params, use_tqdm=False)
    engine = LLMEngine.from_kwargs(model=str(tiny_llama), dtype="float32", max_num_seqs=2,
                                   scheduling_policy="priority")
    engine.add_request("low-a", prompts["low-a"], params, priority=5)
    engine.add_request("low-b", prompts["low-b"], params, priority=5)
    for _ in range(3):
        engine.step()
    engine.add_request("urgent", prompts["urgent"], params, priority=0)
    engine.step()
    running = {seq.request.request_id for seq in engine.scheduler.running}
    assert running == {"low-a", "urgent"}  # low-b, the newest of the lowest priority, made room
    finished = run_to_end(engine)
    assert finished["low-b"].metrics.num_preemptions == 1
    assert finished["urgent"].metrics.num_preemptions == 0
    assert finished["urgent"].metrics.finished_time < finished["low-b"].metrics.finished_time
    for rid, expected in zip(prompts, alone):  # recomputed after preemption: the same greedy tokens
        assert finished[rid].outputs[0].token_ids == expected.outputs[0].token_ids
    assert_all_blocks_free(engine)
