"""Beam search against Transformers' generate(num_beams=..., do_sample=False) in float32, and the
engine's beam groups: one token per beam a step (forked block tables, copy-on-write), in the batch
with other requests, under preemption, with and without prefix caching, and no block leaked."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import build_tiny_model, smollm_gguf_path
from transformers import AutoModelForCausalLM

from llm_engine import LLM
from llm_engine.beam_search import BeamSearchParams
from llm_engine.sampling_params import SamplingParams

PROMPTS = [[1, 17, 42, 99, 5], [1, 250, 3, 3, 8, 77, 120]]


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(model=str(tiny_llama), dtype="float32", block_size=4)


@pytest.fixture(scope="module")
def hf(tiny_llama):
    return AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()


@pytest.mark.parametrize(("width", "length_penalty"), [(2, 1.0), (4, 0.5), (8, 1.0)])
def test_beams_and_scores_match_transformers(llm, hf, width, length_penalty):
    free_before = llm.engine.block_manager.num_free_blocks
    outputs = llm.beam_search(PROMPTS, BeamSearchParams(beam_width=width, max_tokens=6, ignore_eos=True,
                                                        length_penalty=length_penalty))
    for prompt, out in zip(PROMPTS, outputs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), num_beams=width, num_return_sequences=width, do_sample=False,
                              max_new_tokens=6, length_penalty=length_penalty, eos_token_id=None, pad_token_id=0,
                              output_scores=True, return_dict_in_generate=True)
        assert len(out.sequences) == width
        ours = [(beam.output_tokens, beam.score(length_penalty)) for beam in out.sequences]
        theirs = [(seq[len(prompt):].tolist(), float(score)) for seq, score in zip(ref.sequences, ref.sequences_scores)]
        assert [tokens for tokens, _ in ours] == [tokens for tokens, _ in theirs]
        for (_, a), (_, b) in zip(ours, theirs):
            assert abs(a - b) < 1e-4, (a, b)
        assert all(beam.finish_reason == "length" and beam.tokens[:len(prompt)] == prompt for beam in out.sequences)
    assert llm.engine.block_manager.num_free_blocks == free_before  # no block leaked
    assert not llm.engine.has_unfinished_requests()


def test_bad_params():
    with pytest.raises(ValueError, match="beam_width"):
        BeamSearchParams(beam_width=0, max_tokens=4)
    with pytest.raises(ValueError, match="temperature"):
        BeamSearchParams(beam_width=2, max_tokens=4, temperature=0.5)


def test_a_beam_ending_with_eos_ranks_as_in_transformers(llm, hf):
    prompt = [1, 184, 225]  # with this model one of the 4 best beams ends with EOS (2) at step 7
    out = llm.beam_search(prompt, BeamSearchParams(beam_width=4, max_tokens=10))[0]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), num_beams=4, num_return_sequences=4, do_sample=False,
                          max_new_tokens=10, eos_token_id=2, pad_token_id=0, output_scores=True,
                          return_dict_in_generate=True)
    theirs = [seq[len(prompt):].tolist() for seq in ref.sequences]
    theirs = [tokens[:tokens.index(2) + 1] if 2 in tokens else tokens for tokens in theirs]  # drop the padding
    assert [beam.output_tokens for beam in out.sequences] == theirs
    assert any(beam.finish_reason == "stop" for beam in out.sequences)
    for beam, score in zip(out.sequences, ref.sequences_scores.tolist()):
        assert abs(beam.score(1.0) - score) < 1e-4


def test_hundred_beam_requests_in_a_small_pool_leak_no_block(tiny_llama):
    llm = LLM(model=str(tiny_llama), dtype="float32", block_size=4, num_kv_blocks=48)
    total = llm.engine.block_manager.num_free_blocks
    prompts = [[1] + [(7 * i + j) % 300 + 3 for j in range(4 + i % 9)] for i in range(100)]
    outputs = llm.beam_search(prompts, BeamSearchParams(beam_width=2, max_tokens=3))
    assert all(len(out.sequences) == 2 for out in outputs)
    assert llm.engine.get_stats().prefix_cache_hits > 0  # a beam's history comes from the cache
    assert llm.engine.block_manager.num_free_blocks == total


@pytest.mark.parametrize("arch", ["MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_other_architectures_match_transformers(tmp_path, arch):
    folder = build_tiny_model(arch, tmp_path / arch)
    llm = LLM(model=str(folder), dtype="float32")
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompt = PROMPTS[1]
    out = llm.beam_search(prompt, BeamSearchParams(beam_width=4, max_tokens=5, ignore_eos=True))[0]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), num_beams=4, num_return_sequences=4, do_sample=False,
                          max_new_tokens=5, eos_token_id=None, pad_token_id=0, output_scores=True,
                          return_dict_in_generate=True)
    assert [beam.output_tokens for beam in out.sequences] == [s[len(prompt):].tolist() for s in ref.sequences]
    for beam, score in zip(out.sequences, ref.sequences_scores.tolist()):
        assert abs(beam.score(1.0) - score) < 1e-4


@pytest.mark.skipif(not os.environ.get("CODEYARD_GGUF_FULL"), reason="make test-llm-gguf (SmolLM2 loads, ~1 min)")
@pytest.mark.timeout(1800)
def test_smollm2_beams_and_scores_match_transformers():
    """The real SmolLM2 GGUF dequantized to float32 (quantization=None: the weights Transformers'
    GGUF loader makes), widths 2, 4 and 8: the same beams, best first, and scores within 1e-4."""
    path = smollm_gguf_path()
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    llm = LLM(model=str(path), dtype="float32", quantization=None, kv_cache_memory="64MiB")
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer(text).input_ids for text in ("def fibonacci(n):", "The capital of France is")]
    for width, length_penalty in ((2, 1.0), (4, 0.5), (8, 1.0)):
        outputs = llm.beam_search(prompts, BeamSearchParams(beam_width=width, max_tokens=8, ignore_eos=True,
                                                            length_penalty=length_penalty))
        for prompt, out in zip(prompts, outputs):
            with torch.no_grad():
                ref = hf.generate(torch.tensor([prompt]), num_beams=width, num_return_sequences=width,
                                  do_sample=False, max_new_tokens=8, length_penalty=length_penalty,
                                  eos_token_id=None, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
            assert [beam.output_tokens for beam in out.sequences] == [s[len(prompt):].tolist() for s in ref.sequences]
            for beam, score in zip(out.sequences, ref.sequences_scores.tolist()):
                assert abs(beam.score(length_penalty) - score) < 1e-4, (width, beam.score(length_penalty), score)
    assert not llm.engine.has_unfinished_requests()


def _transformers_beams(hf, prompt, width, max_tokens, length_penalty=1.0):
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), num_beams=width, num_return_sequences=width, do_sample=False,
                          max_new_tokens=max_tokens, length_penalty=length_penalty, eos_token_id=None, pad_token_id=0,
                          output_scores=True, return_dict_in_generate=True)
    return [(seq[len(prompt):].tolist(), float(score)) for seq, score in zip(ref.sequences, ref.sequences_scores)]


def _assert_same_beams(ours, theirs):
    assert [tokens for tokens, _ in ours] == [tokens for tokens, _ in theirs]
    for (_, a), (_, b) in zip(ours, theirs):
        assert abs(a - b) < 1e-4, (a, b)


def _record_schedules(engine):
    """Wrap the scheduler so that every step's SchedulerOutput is kept."""
    outs = []
    schedule = engine.scheduler.schedule

    def recording():
        out = schedule()
        outs.append(out)
        return out

    engine.scheduler.schedule = recording
    return outs


def test_each_step_computes_one_token_per_beam(llm, hf):
    """The prompt once, then one token per live beam a step: beams fork block tables, and a shared
    partial block is copied before a beam writes to it (block_size 4, a 7-token prompt)."""
    engine = llm.engine
    prompt = [1, 33, 44, 55, 66, 77, 88]
    outs = _record_schedules(engine)
    try:
        engine.add_request("count", prompt, BeamSearchParams(beam_width=4, max_tokens=6, ignore_eos=True))
        while engine.has_unfinished_requests():
            final = [o for o in engine.step() if o.finished]
    finally:
        del engine.scheduler.schedule
    assert sum(o.num_batched_tokens for o in outs) == len(prompt) + 5 * 4  # 6 steps: the prompt's, 5 of 4 beams
    assert any(o.block_copies for o in outs)  # copy-on-write of the shared partial block
    ours = [(c.token_ids, c.cumulative_logprob / len(c.token_ids)) for c in final[0].outputs]
    _assert_same_beams(ours, _transformers_beams(hf, prompt, 4, 6))


def test_beams_run_in_the_batch_with_other_requests(llm, hf):
    engine = llm.engine
    alone = llm.generate([[1, 5, 6, 7]], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
    outs = _record_schedules(engine)
    try:
        engine.add_request("plain", [1, 5, 6, 7], SamplingParams(temperature=0, max_tokens=8))
        engine.add_request("beams", PROMPTS[0], BeamSearchParams(beam_width=2, max_tokens=6, ignore_eos=True))
        finished = {}
        while engine.has_unfinished_requests():
            finished.update({o.request_id: o for o in engine.step() if o.finished})
    finally:
        del engine.scheduler.schedule
    assert any({s.request.request_id for s, _ in o.scheduled} == {"plain", "beams"} and len(o.scheduled) == 3
               for o in outs)  # one step: the plain request and both beams
    assert finished["plain"].outputs[0].token_ids == alone.outputs[0].token_ids
    ours = [(c.token_ids, c.cumulative_logprob / len(c.token_ids)) for c in finished["beams"].outputs]
    _assert_same_beams(ours, _transformers_beams(hf, PROMPTS[0], 2, 6))


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_beams_match_transformers_under_preemption(tiny_llama, hf, prefix_caching):
    """A pool of 24 blocks for 6 groups of 4 beams: groups are preempted whole and recomputed."""
    llm = LLM(model=str(tiny_llama), dtype="float32", block_size=4, num_kv_blocks=24,
              enable_prefix_caching=prefix_caching)
    prompts = [[1, 9 + i, 40 + 3 * i, 7, 100 + i, 5, 61] for i in range(6)]
    outputs = llm.beam_search(prompts, BeamSearchParams(beam_width=4, max_tokens=6, ignore_eos=True))
    assert llm.engine.scheduler.num_preemptions > 0
    for prompt, out in zip(prompts, outputs):
        _assert_same_beams([(b.output_tokens, b.score(1.0)) for b in out.sequences],
                           _transformers_beams(hf, prompt, 4, 6))
    assert llm.engine.block_manager.num_free_blocks == 24


def test_hundred_beam_requests_with_aborts_leak_no_block(tiny_llama):
    llm = LLM(model=str(tiny_llama), dtype="float32", block_size=4, num_kv_blocks=40)
    engine = llm.engine
    bm = engine.block_manager
    for i in range(100):
        prompt = [1] + [(7 * i + j) % 300 + 3 for j in range(4 + i % 9)]
        engine.add_request(f"b{i}", prompt, BeamSearchParams(beam_width=2 + i % 3, max_tokens=3 + i % 5,
                                                             ignore_eos=i % 2 == 0))
    finished, steps = {}, 0
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
        steps += 1
        engine.abort_request([f"b{i}" for i in range(100) if i % 4 == 0 and i % 7 + 1 == steps])
    assert engine.scheduler.num_preemptions > 0 and len(finished) == 100
    assert sum(1 for o in finished.values() if o.outputs and o.outputs[-1].finish_reason == "abort") > 0
    done = [int(rid[1:]) for rid, o in finished.items() if all(c.finish_reason in ("stop", "length") for c in o.outputs)]
    assert len(done) > 50 and all(len(finished[f"b{i}"].outputs) == 2 + i % 3 for i in done)
    assert bm.num_free_blocks == 40 and all(block.ref_count == 0 for block in bm.blocks)


def test_a_beam_group_too_big_for_the_engine_is_refused(tiny_llama):
    llm = LLM(model=str(tiny_llama), dtype="float32", block_size=4, num_kv_blocks=8, max_num_seqs=4)
    with pytest.raises(ValueError, match="need 9 KV blocks"):
        llm.engine.add_request("big", [1, 2, 3, 4], BeamSearchParams(beam_width=3, max_tokens=8))
    with pytest.raises(ValueError, match="max_num_seqs"):
        llm.engine.add_request("wide", [1, 2, 3], BeamSearchParams(beam_width=5, max_tokens=1))
    assert not llm.engine.has_unfinished_requests()
