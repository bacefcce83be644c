"""The engine core's per-step messages carry what changed (`output_deltas`): the API process rebuilds
exactly the cumulative outputs the engine made, through the socket's pickling, whatever the request."""

from __future__ import annotations

import copy
import pickle
import socket
from dataclasses import fields
from multiprocessing.connection import Connection

import pytest

from llm_engine import LLMEngine, SamplingParams
from llm_engine.beam_search import BeamSearchParams
from llm_engine.engine_core import CoreStep, EngineCore
from llm_engine.engine_loop import NO_COMMAND, AbortRequest
from llm_engine.output_deltas import DeltaDecoder, DeltaEncoder, OutputDelta
from llm_engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput


@pytest.fixture()
def engine(tiny_llama_smollm_vocab):
    return LLMEngine.from_kwargs(model=str(tiny_llama_smollm_vocab), dtype="float32", block_size=16,
                                 num_kv_blocks=64, max_model_len=256)


def wire(items):
    return pickle.loads(pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL))


def snapshot(outputs: list[RequestOutput]) -> list[RequestOutput]:
    """The outputs as they are now (the engine's metrics object changes after the step)."""
    return copy.deepcopy(outputs)


def test_every_step_is_rebuilt_exactly_as_the_engine_made_it(engine):
    encoder, decoder = DeltaEncoder(), DeltaDecoder()
    engine.add_request("plain", "def add(a, b):", SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    engine.add_request("two", "import os\n", SamplingParams(n=2, max_tokens=9, temperature=1.0, seed=3, ignore_eos=True))
    engine.add_request("stop", "class A:", SamplingParams(max_tokens=14, temperature=0, ignore_eos=True, stop=["zz", "qq q"]))
    engine.add_request("logprobs", "x = 1", SamplingParams(max_tokens=5, temperature=0, logprobs=2, prompt_logprobs=1))
    engine.add_request("aborted", "for i in", SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    engine.add_request("beam", "y =", BeamSearchParams(beam_width=2, max_tokens=6, ignore_eos=True))
    steps, deltas, whole = 0, 0, 0
    while engine.has_unfinished_requests():
        outputs = snapshot(engine.step())
        items = wire(encoder.encode(outputs))
        assert decoder.decode(items) == outputs
        deltas += sum(isinstance(i, OutputDelta) for i in items)
        whole += sum(not isinstance(i, OutputDelta) for i in items)
        steps += 1
        if steps == 3:
            engine.abort_request("aborted")
    assert steps > 5 and deltas > 3 * whole  # most of them went as deltas
    assert len(encoder) == len(decoder) == 0  # finished (and aborted) requests are forgotten on both sides


def test_a_plain_request_sends_its_new_tokens_only(engine):
    encoder = DeltaEncoder()
    engine.add_request("r", "def add(a, b):" * 8, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    first = encoder.encode(engine.step())
    second = encoder.encode(engine.step())
    assert not isinstance(first[0], OutputDelta) and isinstance(second[0], OutputDelta)
    change = second[0].completions[0]
    assert change.ids_from == 1 and len(change.token_ids) == 1 and change.text_from == len(first[0][3][0][1])
    assert len(pickle.dumps(second, protocol=5)) * 2 < len(pickle.dumps(first, protocol=5))  # no prompt in it


def output(text: str, ids: list[int], finished: bool = False, logprobs=None) -> RequestOutput:
    metrics = RequestMetrics(arrival_time=1.0, first_token_time=2.0, inter_token_latencies=[0.1] * len(ids))
    return RequestOutput("r", "p", [5, 6], [CompletionOutput(0, text, ids, None, logprobs, "stop" if finished else None)],
                         finished, metrics)


@pytest.mark.parametrize("before, after", [
    (("abc", [1, 2]), ("abd", [1, 2, 3])),  # the detokenizer rewrote the text: it goes whole
    (("abc", [1, 2]), ("abcd", [1, 7, 3])),  # beams reordered: the ids go whole
    (("abcdef", [1, 2, 3]), ("ab", [1, 2, 3, 4])),  # shorter text (a stop string cut it)
])
def test_a_change_that_does_not_just_grow_goes_whole(before, after):
    encoder, decoder = DeltaEncoder(), DeltaDecoder()
    decoder.decode(wire(encoder.encode([output(*before)])))
    new = output(*after)
    assert decoder.decode(wire(encoder.encode([snapshot([new])[0]]))) == [new]


def test_logprobs_and_a_different_number_of_completions_go_whole():
    encoder = DeltaEncoder()
    encoder.encode([output("a", [1])])
    assert not isinstance(encoder.encode([output("ab", [1, 2], logprobs=[{}, {}])])[0], OutputDelta)
    two = output("abc", [1, 2, 3])
    two.outputs.append(CompletionOutput(1, "x", [9], None, None))
    assert not isinstance(encoder.encode([two])[0], OutputDelta)


def test_a_failure_forgets_the_requests_on_both_sides():
    encoder, decoder = DeltaEncoder(), DeltaDecoder()
    decoder.decode(wire(encoder.encode([output("a", [1])])))
    encoder.clear()
    decoder.forget(None)
    assert len(encoder) == len(decoder) == 0
    assert decoder.decode(wire(encoder.encode([output("ab", [1, 2])]))) == [output("ab", [1, 2])]


def test_the_core_sends_deltas_and_reads_commands_through_its_poller(engine):
    ours, theirs = socket.socketpair()
    server, core_side = Connection(ours.detach()), Connection(theirs.detach())
    core = EngineCore(core_side)
    assert core.next_command(0) is NO_COMMAND
    engine.add_request("r", "def add(a, b):", SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    for _ in range(2):
        core.report(engine, engine.step())
    steps = [pickle.loads(server.recv_bytes()) for _ in range(2)]
    assert all(isinstance(s, CoreStep) for s in steps)
    assert not isinstance(steps[0].outputs[0], OutputDelta) and isinstance(steps[1].outputs[0], OutputDelta)
    server.send_bytes(pickle.dumps(AbortRequest("r")))
    assert core.next_command(0.5) == AbortRequest("r")
    assert core.next_command(0.01) is NO_COMMAND
    server.close()
    assert core.next_command(0.5) is None  # the server process is gone: the loop stops


def test_a_whole_output_crosses_as_plain_values_with_every_field():
    """No class is pickled for it (cheaper to pickle and unpickle), and every field comes back."""
    metrics = RequestMetrics(arrival_time=1.0, first_scheduled_time=1.5, first_token_time=2.0, last_token_time=2.5,
                             finished_time=3.0, num_cached_tokens=16, num_preemptions=1, inter_token_latencies=[0.5])
    whole = RequestOutput("r", "p", [5, 6], [CompletionOutput(0, "ab", [1, 2], -0.5, [{1: Logprob(-0.1, 1, "a")}], "stop", 7),
                                             CompletionOutput(1, "c", [3], -0.7, None, "length")],
                          True, metrics, "an error", [None, {6: Logprob(-1.0, 2)}], {"remote": "x"})
    (item,) = encoder_items = DeltaEncoder().encode([whole])
    data = pickle.dumps(encoder_items, protocol=5)
    assert b"RequestOutput" not in data and b"CompletionOutput" not in data and b"RequestMetrics" not in data
    assert len(item) == len(fields(RequestOutput)) and len(item[5]) == len(fields(RequestMetrics))
    assert all(len(c) == len(fields(CompletionOutput)) for c in item[3])
    assert DeltaDecoder().decode(pickle.loads(data)) == [whole]


def test_a_steps_stats_cross_as_plain_values(engine):
    engine.add_request("r", "def add(a, b):", SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    engine.step()
    stats = engine.get_stats()
    data = pickle.dumps(CoreStep.of([], stats, 1), protocol=5)
    assert b"EngineStats" not in data
    assert pickle.loads(data).stats == stats
