"""Sampling parameters: validation, per-request seeds, penalties, min_tokens, n>1, logprobs."""

from __future__ import annotations

import math
import random

import pytest
import torch
from conftest import VOCAB

from llm_engine import LLM, LLMEngine, SamplingParams
from llm_engine.sampler import Sampler, greedy_tokens
from llm_engine.sequence import Request


@pytest.mark.parametrize("field, value", [
    ("n", 0), ("temperature", -0.5), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -3),
    ("min_p", 2.0), ("repetition_penalty", 0.0), ("presence_penalty", 3.0),
    ("frequency_penalty", -2.5), ("seed", 1.5), ("stop", [""]), ("stop_token_ids", [-1]),
    ("max_tokens", 0), ("min_tokens", -1), ("logprobs", -1), ("timeout", 0), ("n", True),
])
def test_invalid_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}:"):
        SamplingParams(**{field: value})


def test_min_tokens_above_max_tokens_is_rejected():
    with pytest.raises(ValueError, match="^min_tokens:"):
        SamplingParams(min_tokens=5, max_tokens=4)


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(model=str(tiny_llama), dtype="float32", max_num_seqs=16)


def random_prompts(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 40))] for _ in range(count)]


def test_same_seed_same_tokens_whatever_the_batch(llm):
    prompt = random_prompts(1, 0)[0]
    params = SamplingParams(temperature=1.0, top_k=40, top_p=0.9, seed=1234, max_tokens=20, ignore_eos=True)
    alone = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    others = random_prompts(7, 1)
    other_params = [SamplingParams(temperature=0.8, seed=s, max_tokens=20 + s) for s in range(6)]
    other_params.append(SamplingParams(temperature=1.2, max_tokens=9))  # unseeded
    batch = llm.generate(others[:3] + [prompt] + others[3:], other_params[:3] + [params] + other_params[3:],
                         use_tqdm=False)
    assert batch[3].outputs[0].token_ids == alone
    reseeded = llm.generate(prompt, SamplingParams(temperature=1.0, top_k=40, top_p=0.9, seed=99,
                                                   max_tokens=20, ignore_eos=True), use_tqdm=False)
    assert reseeded[0].outputs[0].token_ids != alone


def test_top_k_one_and_tiny_top_p_equal_greedy(llm):
    prompts = random_prompts(3, 2)
    greedy = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    top_k = llm.generate(prompts, SamplingParams(temperature=1.5, top_k=1, max_tokens=12, ignore_eos=True),
                         use_tqdm=False)
    top_p = llm.generate(prompts, SamplingParams(temperature=1.5, top_p=1e-6, max_tokens=12, ignore_eos=True),
                         use_tqdm=False)
    min_p = llm.generate(prompts, SamplingParams(temperature=1.5, min_p=1.0, max_tokens=12, ignore_eos=True),
                         use_tqdm=False)
    for g, k, p, m in zip(greedy, top_k, top_p, min_p):
        assert g.outputs[0].token_ids == k.outputs[0].token_ids == p.outputs[0].token_ids == m.outputs[0].token_ids


def test_min_tokens_suppresses_stop_tokens(llm):
    prompt = random_prompts(1, 3)[0]
    first = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)[0]
    stop_token = first.outputs[0].token_ids[0]
    stopped = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[stop_token]),
                           use_tqdm=False)[0].outputs[0]
    assert stopped.token_ids == [stop_token]
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", stop_token)
    held = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=10, min_tokens=4,
                                               stop_token_ids=[stop_token]), use_tqdm=False)[0].outputs[0]
    assert len(held.token_ids) >= 4 and stop_token not in held.token_ids[:4]


def test_n_samples_share_prompt_blocks(tiny_llama):
    engine = LLMEngine.from_kwargs(model=str(tiny_llama), dtype="float32", block_size=16)
    prompt = random_prompts(1, 4)[0] + list(range(3, 40))
    engine.add_request("r", prompt, SamplingParams(n=4, temperature=1.0, seed=5, max_tokens=8, ignore_eos=True))
    engine.step()  # prefill + first tokens
    request = engine.requests["r"]
    assert len(request.seqs) == 4
    first_block = request.seqs[0].block_table[0]
    assert all(s.block_table[0] == first_block for s in request.seqs)
    assert engine.block_manager.blocks[first_block].ref_count == 4
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [o for o in engine.step() if o.finished]
    samples = outputs[0].outputs
    assert [c.index for c in samples] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 8 for c in samples)
    assert len({tuple(c.token_ids) for c in samples}) > 1
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_logprobs_top_n(llm):
    out = llm.generate(random_prompts(1, 5)[0], SamplingParams(temperature=0, max_tokens=3, logprobs=5),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == 3
    for token, top in zip(out.token_ids, out.logprobs):
        assert top[token].rank == 1
        assert len(top) == 5
        ranks = sorted(lp.rank for lp in top.values())
        assert ranks == [1, 2, 3, 4, 5]
        assert sum(math.exp(lp.logprob) for lp in top.values()) <= 1.0 + 1e-5
    assert out.cumulative_logprob == pytest.approx(sum(top[t].logprob for t, top in zip(out.token_ids, out.logprobs)))


def sampler_seq(output: list[int], prompt: list[int], **params):
    request = Request("x", None, prompt, SamplingParams(**params))
    seq = request.seqs[0]
    seq.token_ids += output
    return seq


def test_repetition_presence_frequency_penalties():
    sampler = Sampler(seed=0)
    logits = torch.tensor([[2.0, 1.9, 1.2, -1.0]])
    assert sampler(logits, [sampler_seq([], [3], temperature=0)], set())[0].token_id == 0
    # Token 0 was generated before: a repetition penalty of 2 halves its logit (2.0 -> 1.0).
    seq = sampler_seq([0], [3], temperature=0, repetition_penalty=2.0)
    assert sampler(logits, [seq], set())[0].token_id == 1
    # Prompt tokens count for the repetition penalty too: token 1 in the prompt, 0 generated.
    seq = sampler_seq([0], [1], temperature=0, repetition_penalty=2.0)
    assert sampler(logits, [seq], set())[0].token_id == 2
    # Presence penalty subtracts once per seen token; frequency penalty once per occurrence.
    seq = sampler_seq([0], [3], temperature=0, presence_penalty=0.2)
    assert sampler(logits, [seq], set())[0].token_id == 1
    seq = sampler_seq([1, 1, 1], [3], temperature=0, frequency_penalty=0.2)
    assert sampler(logits, [seq], set())[0].token_id == 0
    seq = sampler_seq([0], [3], temperature=0, frequency_penalty=-1.0)
    assert sampler(logits, [seq], set())[0].token_id == 0
    # Penalties apply per row: a neighbour without them is untouched.
    rows = sampler(logits.repeat(2, 1), [sampler_seq([0], [3], temperature=0, presence_penalty=0.2),
                                         sampler_seq([0], [3], temperature=0)], set())
    assert [r.token_id for r in rows] == [1, 0]


def test_prompt_logprobs_match_transformers_over_chunks_and_a_warm_prefix_cache(tiny_llama):
    from transformers import AutoModelForCausalLM

    prompt = [(7 * i) % 300 + 3 for i in range(40)]
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    with torch.no_grad():
        expected = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
    llm = LLM(model=str(tiny_llama), dtype="float32", max_num_batched_tokens=16)
    llm.generate(prompt, SamplingParams(max_tokens=1), use_tqdm=False)  # the prompt's blocks are now cached
    out = llm.generate(prompt, SamplingParams(max_tokens=2, prompt_logprobs=3), use_tqdm=False)[0]
    entries = out.prompt_logprobs
    assert len(entries) == len(prompt) and entries[0] is None
    assert out.metrics.num_cached_tokens == 0  # prompt logprobs need the prompt computed
    for position, entry in enumerate(entries[1:], start=1):
        row = expected[position - 1]
        token = prompt[position]
        assert abs(entry[token].logprob - float(row[token])) < 1e-4
        assert entry[token].rank == int((row > row[token]).sum()) + 1
        assert sorted(t for t, lp in entry.items() if lp.rank <= 3) == sorted(row.topk(3).indices.tolist())
    assert llm.generate(prompt, SamplingParams(max_tokens=1), use_tqdm=False)[0].prompt_logprobs is None
    with pytest.raises(ValueError, match="^prompt_logprobs:"):
        SamplingParams(prompt_logprobs=-1)


def test_greedy_tokens_agree_with_torch_argmax():
    logits = torch.randn(6, 49152, generator=torch.Generator().manual_seed(0))
    logits[1, 7] = logits[1, 9] = logits[1].max() + 1.0  # equal maxima: the first wins
    logits[2, 5] = float("nan")  # NaN counts as the largest
    logits[3] = float("-inf")
    expected = logits.argmax(dim=-1)
    assert greedy_tokens(logits).tolist() == expected.tolist() == [*expected[:1].tolist(), 7, 5, 0,
                                                                  *expected[4:].tolist()]
    assert greedy_tokens(logits[::2]).tolist() == expected[::2].tolist()  # strided rows
    assert greedy_tokens(logits.bfloat16()).tolist() == logits.bfloat16().argmax(dim=-1).tolist()
