"""The batched benchmark's decode-step breakdown by part of the model, on a tiny random Llama."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from benchmarks.suites.decode_parts import DecodeParts


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    from llm_engine import LLM

    config = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-llama-parts")
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    return LLM(model=str(folder), dtype="float32", block_size=4, num_threads=1)


def generate(llm, batch: int, tokens: int) -> None:
    from llm_engine import SamplingParams

    prompts = [[3 + (7 * i + j) % 300 for j in range(12)] for i in range(batch)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True), use_tqdm=False)


def test_counts_only_steps_of_that_many_decoding_sequences_and_splits_them(tiny_llm):
    with DecodeParts(tiny_llm, 3) as parts:
        generate(tiny_llm, 3, 6)  # one prefill step, then 5 steps of 3 decodes
        generate(tiny_llm, 2, 4)  # steps of 2 sequences: not counted
    assert parts.steps == {"decode": 5, "prompt": 2}  # each generate's prompt step is counted apart
    figures = parts.parts()
    assert list(figures) == ["step", "linear", "attention", "norm/act/rotary", "layer glue", "lm head",
                             "step rest", "sample"]
    assert all(value > 0 for name, value in figures.items() if name != "step rest")
    inside = sum(figures[name] for name in ("linear", "attention", "norm/act/rotary", "layer glue", "lm head"))
    assert inside <= figures["step"] + 1e-9 and figures["step rest"] >= -1e-6


def test_leaving_puts_every_wrapped_callable_back(tiny_llm):
    runner = tiny_llm.engine.model_runner
    before = runner.execute  # another clock's wrapper on the instance stays in place
    runner.execute = lambda scheduled, copies: before(scheduled, copies)
    outer = runner.execute
    with DecodeParts(tiny_llm, 2):
        assert runner.execute is not outer and "forward" in vars(runner.model.model.layers[0])
    assert runner.execute is outer
    del runner.execute
    assert all("forward" not in vars(m) for m in runner.model.modules())
    assert "compute_logits" not in vars(runner.model) and "sample" not in vars(runner)
    with DecodeParts(tiny_llm, 2) as unused:
        pass
    assert unused.parts() == {}  # nothing counted


def test_prompt_phase_is_summed_apart_from_the_decode_steps(tiny_llm):
    with DecodeParts(tiny_llm, 3) as parts:
        generate(tiny_llm, 3, 2)  # one prompt step of 36 rows, then one decode step
    assert parts.steps == {"decode": 1, "prompt": 1}
    prompt, per_step = parts.parts("prompt", per_step=False), parts.parts("prompt")
    assert prompt == per_step and prompt["linear"] > 0 and prompt["attention"] > 0
    assert parts.totals["prompt"]["linear"] != parts.totals["decode"]["linear"]
    with pytest.raises(ValueError, match="phase"):
        parts.parts("prefill")
