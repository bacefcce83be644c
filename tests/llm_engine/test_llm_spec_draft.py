"""Speculative decoding with a draft model: greedy identity, full acceptance by an equal draft, the
draft's KV pool freed and rolled back, and the config's errors (also from `codeyard llm serve`)."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import COMMON, VOCAB
from test_llm_spec_decode import IDENTITY_PROMPTS, mixed_requests, run_all
from transformers import AutoModelForCausalLM, LlamaConfig

from llm_engine import LLM, LLMEngine, SamplingParams
from llm_engine.speculative import SpeculativeConfig

CODEYARD = [str(Path(sys.executable).parent / "codeyard")]
# The default suite's share of the mixed prompts (`make test-llm-decoding` runs all 200).
DRAFT_PROMPTS = IDENTITY_PROMPTS if IDENTITY_PROMPTS > 32 else 16


@pytest.fixture(scope="module")
def tiny_draft(tiny_llama, tmp_path_factory) -> Path:
    """A self-speculative cut of the tiny target: its first layer and its own head."""
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    model.model.layers = model.model.layers[:1]
    model.config.num_hidden_layers = 1
    folder = tmp_path_factory.mktemp("tiny-draft")
    model.save_pretrained(folder)
    return folder


def test_greedy_output_is_identical_with_a_draft_model_under_preemption_and_prefix_caching(tiny_llama, tiny_draft):
    requests = mixed_requests(random.Random(81), DRAFT_PROMPTS)
    common = dict(dtype="float32", block_size=8, num_kv_blocks=48, max_num_seqs=16, max_num_batched_tokens=40,
                  enable_prefix_caching=True)
    plain = run_all(LLM(str(tiny_llama), **common), requests)
    llm = LLM(str(tiny_llama), speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 3},
              **common)
    spec = run_all(llm, requests)
    for i, (a, b) in enumerate(zip(plain, spec)):
        for x, y in zip(a.outputs, b.outputs, strict=True):
            assert x.token_ids == y.token_ids, f"request {i} sample {x.index}"
            assert x.finish_reason == y.finish_reason and x.stop_reason == y.stop_reason
    engine = llm.engine
    stats = engine.get_stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert 0 < stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens
    assert stats.num_free_blocks == stats.num_total_blocks
    assert engine.drafter.num_free_blocks == engine.drafter.runner.num_blocks and not engine.drafter.kv


def test_a_draft_equal_to_the_target_gets_every_token_accepted_and_aborts_free_its_blocks(tiny_llama):
    engine = LLMEngine.from_kwargs(model=str(tiny_llama), dtype="float32", block_size=4, num_kv_blocks=96,
                                   speculative_config={"method": "draft_model", "model": str(tiny_llama),
                                                       "num_speculative_tokens": 4})
    rng = random.Random(5)
    for i in range(5):
        prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 20))]
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    drafter, steps = engine.drafter, 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
        if steps == 4:
            engine.abort_request("r2")
        for seq in engine.scheduler.running:  # all its drafts accepted: the draft's KV is the sequence's
            kv = drafter.kv.get(seq.seq_id)
            assert kv is None or kv.token_ids == seq.token_ids[:len(kv.token_ids)]
    stats = engine.get_stats()
    assert stats.spec_decode_num_drafts > 0
    assert stats.spec_decode_num_accepted_tokens == stats.spec_decode_num_draft_tokens
    assert stats.spec_decode_mean_acceptance_length > 3
    assert drafter.num_free_blocks == drafter.runner.num_blocks and not drafter.kv


def test_sampled_verification_of_draft_tokens_keeps_the_target_s_choice(tiny_llama, tiny_draft):
    """top_k=1 makes the target's distribution a point mass: sampling through rejection of the
    draft's tokens must then give exactly the greedy tokens."""
    llm = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=8,
              speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 3})
    rng = random.Random(7)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(6)] * 3 for _ in range(4)]
    greedy = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True), use_tqdm=False)
    sampled = llm.generate(prompts, SamplingParams(temperature=1.0, top_k=1, seed=3, max_tokens=20, ignore_eos=True),
                           use_tqdm=False)
    assert [o.outputs[0].token_ids for o in greedy] == [o.outputs[0].token_ids for o in sampled]
    stats = llm.engine.get_stats()
    assert 0 < stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens


def test_a_draft_with_another_vocabulary_is_a_clear_error(tiny_llama, tmp_path):
    config = LlamaConfig(**{**COMMON, "vocab_size": VOCAB // 2, "num_hidden_layers": 1})
    config.architectures = ["LlamaForCausalLM"]
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"vocabulary has {VOCAB // 2} tokens, the target's {VOCAB}"):
        LLM(str(tiny_llama), dtype="float32", num_kv_blocks=16,
            speculative_config={"method": "draft_model", "model": str(tmp_path)})


@pytest.mark.parametrize("config, message", [
    ({"method": "draft_model"}, "model: required"),
    ({"method": "ngram", "model": "."}, "model: required"),
    ({"model": ".", "prompt_lookup_max": 3}, "only apply to method 'ngram'"),
    ({"model": "/no/such/draft"}, "does not exist"),
    ({"model": 7}, "must be a path"),
])
def test_bad_draft_model_config_names_the_field(config, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_dict(config)


def test_a_model_alone_means_a_draft_model_as_in_vllm():
    config = SpeculativeConfig.from_dict({"model": ".", "num_speculative_tokens": 3})
    assert (config.method, config.model, config.num_speculative_tokens) == ("draft_model", ".", 3)


def test_serve_parses_a_draft_model_speculative_config(tiny_llama):
    """The option reaches the draft-model config: its checks answer on the command line (exit 2)."""
    result = subprocess.run([*CODEYARD, "llm", "serve", "--model", str(tiny_llama), "--speculative-config",
                             '{"method": "draft_model", "model": "/no/such/draft", "num_speculative_tokens": 3}'],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "speculative_config.model: path '/no/such/draft' does not exist" in result.stderr
