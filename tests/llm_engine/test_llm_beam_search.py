"""Beam search against Transformers' generate(num_beams=..., do_sample=False) in float32."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import build_tiny_model, smollm_gguf_path
from transformers import AutoModelForCausalLM

from llm_engine import LLM
from llm_engine.beam_search import BeamSearchParams

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
