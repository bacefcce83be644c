"""Incremental detokenization and stop strings, with SmolLM2's real tokenizer."""

from __future__ import annotations

import pytest
from conftest import smollm_gguf_path

from llm_engine import LLM, SamplingParams
from llm_engine.detokenizer import IncrementalDetokenizer, find_stop_string
from llm_engine.loader.gguf_conversion import config_and_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return config_and_tokenizer(smollm_gguf_path())[1]


def test_incremental_text_equals_full_decode(tokenizer):
    text = "Café déjà vu — naïve 🙂 emoji, 中文字符 and code: def f(x):\n    return x**2"
    prompt = tokenizer("Say:").input_ids
    ids = tokenizer(text).input_ids
    detok = IncrementalDetokenizer(tokenizer, prompt, SamplingParams())
    tokens, pieces = list(prompt), []
    for token in ids:
        tokens.append(token)
        pieces.append(detok.decode_new(tokens))
    assert "".join(pieces) == tokenizer.decode(ids)
    assert "" in pieces  # the emoji / CJK bytes were held back until complete


def test_find_stop_string_across_boundaries():
    assert find_stop_string("hello wor", 3, ["world"], False) is None
    assert find_stop_string("hello world!", 3, ["world"], False) == ("hello ", "world")
    assert find_stop_string("hello world!", 3, ["world"], True) == ("hello world", "world")
    assert find_stop_string("ab STOP cd END", 4, ["END", "STOP"], False) == ("ab STOP cd ", "END")
    assert find_stop_string("x STOP y END", 12, ["END", "STOP"], False) == ("x ", "STOP")


@pytest.fixture(scope="module")
def model_with_tokenizer(tiny_llama_smollm_vocab):
    return LLM(model=str(tiny_llama_smollm_vocab), dtype="float32")


def test_stop_string_spanning_tokens_is_trimmed(model_with_tokenizer):
    llm = model_with_tokenizer
    tokenizer = llm.get_tokenizer()
    prompt = "Once upon a time"
    full = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True), use_tqdm=False)[0]
    ids = full.outputs[0].token_ids
    assert full.outputs[0].text == tokenizer.decode(ids, skip_special_tokens=True)
    # A stop string made of the last character of one token and the first of the next.
    text = full.outputs[0].text
    stop, start = None, -1
    for i in range(2, len(ids) - 1):
        upto = len(tokenizer.decode(ids[:i], skip_special_tokens=True))
        after = len(tokenizer.decode(ids[:i + 1], skip_special_tokens=True))
        candidate = text[upto - 1:upto + 1]
        if after > upto > 0 and len(candidate) == 2 and text.find(candidate) == upto - 1:
            stop, start = candidate, upto - 1
            break
    assert stop is not None, text
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=30, stop=[stop], ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert out.text == full.outputs[0].text[:start]
    kept = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=30, stop=stop,
                                               include_stop_str_in_output=True, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0]
    assert kept.text == full.outputs[0].text[:start + len(stop)]


def test_string_prompts_are_tokenized_with_the_models_tokenizer(model_with_tokenizer):
    out = model_with_tokenizer.generate(["Hello there"], SamplingParams(max_tokens=2), use_tqdm=False)[0]
    assert out.prompt == "Hello there"
    assert out.prompt_token_ids == model_with_tokenizer.get_tokenizer()("Hello there").input_ids
