"""Beam search through the completions endpoint (vLLM's use_beam_search / best_of fields)."""

from __future__ import annotations

import openai
import pytest

from llm_engine import LLM, BeamSearchParams

from .conftest import TINY_NAME


def test_use_beam_search_returns_the_n_best_beams_of_llm_beam_search(client, tiny_chat_model, smollm_tokenizer):
    prompts = ["def add(a, b):", "The capital of"]
    out = client.completions.create(model=TINY_NAME, prompt=prompts, n=2, max_tokens=5, temperature=0,
                                    extra_body={"use_beam_search": True, "best_of": 3, "ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert out.usage.completion_tokens == 4 * 5
    offline = LLM(model=str(tiny_chat_model), dtype="float32").beam_search(
        prompts, BeamSearchParams(beam_width=3, max_tokens=5, ignore_eos=True))
    expected = [smollm_tokenizer.decode(beam.output_tokens) for result in offline for beam in result.sequences[:2]]
    assert [c.text for c in out.choices] == expected
    assert {c.finish_reason for c in out.choices} == {"length"}


@pytest.mark.parametrize(("extra", "message"), [
    ({"use_beam_search": True, "best_of": 1}, "best_of (1) must be at least n (2)"),
    ({"use_beam_search": True, "echo": True}, "echo is not supported with use_beam_search"),
])
def test_beam_search_refuses_what_it_cannot_do(client, extra, message):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=TINY_NAME, prompt="x", n=2, max_tokens=3, extra_body=extra)
    assert message in info.value.body["message"]
    with pytest.raises(openai.BadRequestError, match="stream is not supported"):
        client.completions.create(model=TINY_NAME, prompt="x", max_tokens=3, stream=True,
                                  extra_body={"use_beam_search": True})
