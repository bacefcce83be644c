"""Speculative decoding by prompt lookup: proposer, throttle, greedy identity, rejection sampling."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable

import pytest
import torch
from conftest import VOCAB

from llm_engine import LLM, LLMEngine, SamplingParams
from llm_engine.metrics import EngineMetrics
from llm_engine.sampler import Sampler
from llm_engine.sequence import Request, Sequence
from llm_engine.speculative import (
    NgramMatch,
    SpecThrottle,
    SpeculativeConfig,
    VerifyCost,
    best_draft_length,
    find_ngram,
)


def chi_square_pvalue(counts: torch.Tensor, expected: torch.Tensor) -> float:
    statistic = float(((counts - expected) ** 2 / expected).sum())
    dof = counts.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


# `make test-llm-decoding` runs the 200 prompts; the default suite a quicker 32.
IDENTITY_PROMPTS = 200 if os.environ.get("CODEYARD_DECODING_FULL") else 32
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def test_proposer_takes_the_longest_latest_match_and_never_the_suffix_itself():
    tokens = [5, 6, 7, 8, 9, 1, 6, 7, 2, 3, 5, 6, 7]
    assert find_ngram(tokens, n_max=3, n_min=1) == NgramMatch(start=3, context=3)  # "5 6 7" beats the later "6 7"
    # Two "6 7"s: the one after "5", as the suffix's own "6 7" is, beats the later one after "1".
    assert find_ngram(tokens, n_max=2, n_min=1) == NgramMatch(start=3, context=3)
    tokens = [5, 6, 7, 8, 9, 1, 6, 7, 2, 3, 4, 6, 7]  # no earlier "6 7" has the suffix's context
    assert find_ngram(tokens, n_max=2, n_min=1) == NgramMatch(start=8, context=2)  # so the latest occurrence
    assert find_ngram([1, 2, 3, 4], n_max=3, n_min=1) is None
    assert find_ngram([4, 4], n_max=3, n_min=1) == NgramMatch(start=1, context=1)  # followed by a token
    assert find_ngram([4], n_max=3, n_min=1) is None
    copy = list(range(40))
    match = find_ngram(copy + copy[:30], n_max=4, n_min=1)  # a long copy: context counted up to 16
    assert match == NgramMatch(start=30, context=16) and match.bucket == 2
    assert find_ngram(copy + copy[:30], n_max=20, n_min=1) == NgramMatch(start=30, context=20)  # a longer n_max
    assert [NgramMatch(0, n).bucket for n in (1, 2, 3)] == [0, 1, 2]


def linear(fraction: float) -> Callable[[int], float]:
    """A step cost linear in the width: each token over the first `fraction` of a one-token step."""
    return lambda width: 1 + fraction * (width - 1)


def test_throttle_drafts_what_acceptance_pays_for_and_pauses_when_nothing_does():
    throttle = SpecThrottle(8)
    # The prior a = 0.6 at 0.2 a token: 1 + .6 + .36 = 1.96 tokens for 1.4 beats any other length.
    assert throttle.allowed(linear(0.2)) == 2
    for _ in range(6):
        throttle.record(4, 4)  # copying: every drafted token accepted
    assert throttle.allowed(linear(0.3)) == 8 and throttle.allowed(linear(0.01)) == 8  # capped
    lengths = [8]
    while lengths[-1] and len(lengths) < 20:  # then nothing is accepted: drafts shorten as the estimate falls
        throttle.record(2, 0)
        lengths.append(throttle.allowed(linear(0.3)))
    assert lengths[-1] == 0 and lengths == sorted(lengths, reverse=True) and len(set(lengths)) >= 4
    assert throttle.acceptance() < 0.3
    assert [throttle.allowed(linear(0.3)) for _ in range(2)] == [0, 1]  # paused 2 chances, then a probe
    throttle.record(1, 0)
    assert throttle.allowed(linear(0.3)) == 0 and throttle.pause[0] == 4  # each pause twice the last, to 64
    assert throttle.allowed(linear(0.1)) == 0  # still paused, whatever the cost
    for _ in range(3):
        throttle.allowed(linear(0.1))
    assert throttle.allowed(linear(0.1)) == 1  # a cheap verification pays at a lower acceptance


def test_throttle_keeps_short_and_long_matches_apart():
    throttle = SpecThrottle(8)
    for _ in range(6):  # (a verification this cheap pays for a token at any acceptance)
        assert throttle.allowed(linear(0.01), bucket=0) >= 1
        throttle.record(1, 0)  # one-token matches: rejected
        drafted = throttle.allowed(linear(0.01), bucket=2)
        throttle.record(drafted, drafted)  # long matches: the copy goes on
    assert throttle.acceptance(0) < 0.1 < 0.9 < throttle.acceptance(2)
    assert throttle.allowed(linear(0.2), bucket=0) == 0
    assert throttle.allowed(linear(0.2), bucket=2) == 8
    assert throttle.allowed(linear(0.2), bucket=1) == 2  # untouched: the prior, as above


def test_draft_length_follows_the_measured_cost_of_each_width():
    # A kernel taking rows 8 at a time: 9 rows cost much more than 8.
    steps = {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3, 5: 1.4, 6: 1.5, 7: 1.6, 8: 1.7, 9: 3.0, 10: 3.1}
    assert best_draft_length(0.95, steps.__getitem__, 9) == 7  # 8 rows, not 9
    assert best_draft_length(0.95, linear(0.1), 9) == 9
    assert best_draft_length(0.05, linear(0.1), 9) == 0  # nothing pays


def test_verify_cost_is_each_width_against_a_one_token_step():
    cost = VerifyCost(initial=0.3)
    assert cost.fraction == 0.3 and cost.relative(5) == pytest.approx(2.2)  # until both kinds were seen
    for _ in range(40):
        cost.record(1, 0.020)
        cost.record(5, 0.036)
    assert cost.fraction == pytest.approx(0.2, rel=0.05)  # (36 - 20) / 4 ms per token, over 20 ms
    assert cost.relative(5) == pytest.approx(1.8, rel=0.02)  # measured
    assert cost.relative(3) == pytest.approx(1.4, rel=0.05)  # not seen: priced by the fraction
    cost.record(9, 0.060)
    assert cost.relative(9) == pytest.approx(2.6, rel=0.05)  # seen once: still the fraction's price
    cost.record(9, 0.060)
    cost.record(9, 0.060)
    assert cost.relative(9) == pytest.approx(3.0, rel=0.01)  # seen enough: its own mean
    cost.record(3, 0.001)  # a step faster than a one-token one (noise) counts as free
    assert 0.01 <= cost.fraction < 0.2


def test_a_cpu_engine_times_its_steps_by_the_engine_threads_cpu_time(tiny_llama):
    """The forward runs on the stepping thread: time other processes take is not verification cost."""
    engine = LLMEngine.from_kwargs(model=str(tiny_llama), dtype="float32", block_size=4, num_kv_blocks=16,
                                   speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    assert engine.verify_cost.clock is time.thread_time
    assert VerifyCost().clock is time.perf_counter  # elsewhere (GPUs, worker ranks): wall time


@pytest.mark.parametrize("config, message", [
    ({"method": "eagle"}, "method"),
    ({"method": "draft_model", "model": "/no/such/draft"}, "does not exist"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup_min"),
    ({"method": "ngram", "lookahead": 2}, "unknown field"),
    ("ngram", "expected a dict"),
])
def test_bad_speculative_config_names_the_field(tiny_llama, config, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_dict(config)
    with pytest.raises(ValueError, match=message):
        LLM(str(tiny_llama), speculative_config=config)


def mixed_requests(rng: random.Random, count: int) -> list[tuple[list[int], SamplingParams]]:
    """Prompts that repeat themselves (drafts get accepted), share prefixes (prefix cache) or are
    random, with varied stops, n and logprobs; all greedy."""
    shared = [rng.randrange(3, VOCAB) for _ in range(24)]
    requests = []
    for i in range(count):
        kind = i % 3
        piece = [rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 12))]
        if kind == 0:
            prompt = piece * rng.randint(2, 5)
        elif kind == 1:
            prompt = shared + piece
        else:
            prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 60))]
        params = SamplingParams(temperature=0.0, max_tokens=rng.randint(4, 28), ignore_eos=rng.random() < 0.7,
                                n=rng.choice([1, 1, 1, 2]), logprobs=rng.choice([None, None, 1]),
                                stop_token_ids=rng.choice([None, [rng.randrange(3, VOCAB)]]))
        requests.append((prompt, params))
    return requests


def run_all(llm: LLM, requests) -> list:
    return llm.generate([p for p, _ in requests], [s for _, s in requests], use_tqdm=False)


def test_greedy_output_is_identical_with_prompt_lookup_under_preemption_and_chunked_prefill(tiny_llama):
    requests = mixed_requests(random.Random(18), IDENTITY_PROMPTS)
    common = dict(dtype="float32", block_size=8, num_kv_blocks=48, max_num_seqs=16, max_num_batched_tokens=40,
                  enable_prefix_caching=True)
    plain = run_all(LLM(str(tiny_llama), **common), requests)
    llm = LLM(str(tiny_llama), speculative_config=NGRAM, **common)
    spec = run_all(llm, requests)
    for i, (a, b) in enumerate(zip(plain, spec)):
        for x, y in zip(a.outputs, b.outputs, strict=True):
            assert x.token_ids == y.token_ids, f"request {i} sample {x.index}"
            assert x.finish_reason == y.finish_reason and x.stop_reason == y.stop_reason
            if x.logprobs is not None:
                for step, (lx, ly) in enumerate(zip(x.logprobs, y.logprobs, strict=True)):
                    assert lx.keys() == ly.keys(), f"request {i} step {step}"
                    assert all(abs(lx[t].logprob - ly[t].logprob) < 1e-4 for t in lx)
    stats = llm.engine.get_stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert stats.spec_decode_num_accepted_tokens > 0
    assert stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens  # some were rolled back
    assert stats.num_free_blocks == stats.num_total_blocks
    assert all(block.ref_count == 0 for block in llm.engine.block_manager.blocks)


def test_rejected_slots_are_rolled_back_every_step_and_aborts_free_everything(tiny_llama):
    engine = LLMEngine.from_kwargs(model=str(tiny_llama), dtype="float32", block_size=4, num_kv_blocks=64,
                                   speculative_config={"method": "ngram", "num_speculative_tokens": 6})
    rng = random.Random(3)
    for i in range(6):
        piece = [rng.randrange(3, VOCAB) for _ in range(5)]
        engine.add_request(f"r{i}", piece * 4, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
        if steps == 5:
            engine.abort_request(["r1", "r4"])
        for seq in engine.scheduler.running:  # no block beyond the sequence's own tokens survives a step
            assert len(seq.block_table) <= engine.block_manager.blocks_needed(seq.num_tokens)
            assert seq.num_computed_tokens == seq.num_tokens - 1 and not seq.spec_token_ids
    stats = engine.get_stats()
    assert stats.spec_decode_num_drafts > 0
    assert stats.num_free_blocks == stats.num_total_blocks


def verified_draws(logits: torch.Tensor, seq: Sequence, draft: list[int], trials: int,
                   eos_token_ids: set[int] | None = None) -> list[list[int]]:
    """The tokens of `trials` verifications of one draft, each drawn anew."""
    sampler = Sampler(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of tiny ops: threads only add overhead
    try:
        return [[r.token_id for r in sampler.verify(logits, seq, draft, eos_token_ids)] for _ in range(trials)]
    finally:
        torch.set_num_threads(threads)


def test_rejection_sampling_follows_the_target_distribution():
    """Chi-square over seeded draws: the first emitted token follows p0 whatever the draft, and
    the second, after the first draft token was accepted, follows p1."""
    vocab, trials = 8, 4000
    torch.manual_seed(0)
    logits = torch.randn(3, vocab) * 1.5
    draft = [int(logits[0].argsort()[-2]), 3]  # the second most likely token: often rejected, often not
    seq = Request("x", None, [1], SamplingParams(temperature=0.8, top_p=0.95, seed=7)).seqs[0]
    p = Sampler._probs(logits, [seq] * 3)
    first, second = torch.zeros(vocab), torch.zeros(vocab)
    for tokens in verified_draws(logits, seq, draft, trials):
        first[tokens[0]] += 1
        if tokens[0] == draft[0]:
            second[tokens[1]] += 1
    for counts, probs in ((first, p[0]), (second, p[1])):
        support = probs > 0
        assert counts[~support].sum() == 0  # nothing outside top-p
        expected = probs[support] / probs[support].sum() * counts.sum()
        assert chi_square_pvalue(counts[support], expected) > 1e-3
    assert second.sum() > 300  # the accepted branch was exercised


def test_greedy_output_with_penalties_and_min_tokens_is_identical_with_drafts(tiny_llama):
    """Requests with repetition/frequency/presence penalties or pending min_tokens get drafts, and
    each verify row is penalised over the tokens before it (the draft's own included): greedy
    output equals no speculation, token for token."""
    requests = []
    strong = [dict(repetition_penalty=1.5), dict(frequency_penalty=2.0), dict(presence_penalty=2.0),
              dict(min_tokens=20, frequency_penalty=1.0)]  # a draft's own repeats change the next row
    mild = [dict(repetition_penalty=1.3), dict(frequency_penalty=0.6), dict(presence_penalty=0.8),
            dict(min_tokens=20, repetition_penalty=1.1)]  # drafts get accepted
    for seed, kinds in ((5, strong), (6, mild)):
        rng = random.Random(seed)
        for i in range(12):
            piece = [rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 8))]
            requests.append((piece * 5, SamplingParams(temperature=0.0, max_tokens=28, logprobs=1, **kinds[i % 4])))
    common = dict(dtype="float32", block_size=8, num_kv_blocks=64, enable_prefix_caching=True)
    plain = run_all(LLM(str(tiny_llama), **common), requests)
    llm = LLM(str(tiny_llama), speculative_config=NGRAM, **common)
    spec = run_all(llm, requests)
    for i, (a, b) in enumerate(zip(plain, spec)):
        x, y = a.outputs[0], b.outputs[0]
        assert x.token_ids == y.token_ids, f"request {i}"
        assert x.finish_reason == y.finish_reason
        assert all(abs(lx[t].logprob - ly[t].logprob) < 1e-4 for lx, ly in zip(x.logprobs, y.logprobs) for t in lx)
    assert all(len(out.outputs[0].token_ids) >= 20 for out in spec[3::4])  # min_tokens held
    stats = llm.engine.get_stats()
    assert stats.spec_decode_num_drafts > 0 and stats.spec_decode_num_accepted_tokens > 0


def test_rejection_sampling_with_penalties_follows_the_penalised_distribution():
    """Frequency and presence penalties: the first emitted token follows p0 penalised over the
    sequence's outputs, the second (after draft[0] was accepted) p1 penalised over those and
    draft[0]; min_tokens 4 keeps EOS (2) off the first row (the 4th output) only."""
    vocab, trials = 8, 4000
    torch.manual_seed(1)
    logits = torch.randn(3, vocab) * 1.5
    params = SamplingParams(temperature=0.8, frequency_penalty=0.7, presence_penalty=0.5, min_tokens=4, seed=7)
    seq = Request("x", None, [1], params).seqs[0]
    seq.token_ids += [5, 5, 6]  # outputs so far
    draft = [int(logits[0].argsort()[-1]), 3]
    assert draft[0] not in (5, 6)
    logits[1, draft[0]] = logits[1].max() + 0.5  # the likeliest next unless its penalty counts
    expected = []
    for i, outputs in enumerate(([5, 5, 6], [5, 5, 6, draft[0]])):
        row = logits[i].clone()
        counts = torch.bincount(torch.tensor(outputs), minlength=vocab).float()
        row -= 0.7 * counts + 0.5 * (counts > 0).float()
        if i == 0:
            row[2] = float("-inf")
        expected.append(Sampler._probs(row[None], [seq])[0])
    first, second = torch.zeros(vocab), torch.zeros(vocab)
    for tokens in verified_draws(logits, seq, draft, trials, eos_token_ids={2}):
        first[tokens[0]] += 1
        if tokens[0] == draft[0]:
            second[tokens[1]] += 1
    for counts, probs in ((first, expected[0]), (second, expected[1])):
        support = probs > 0
        assert counts[~support].sum() == 0  # no EOS before min_tokens
        assert chi_square_pvalue(counts[support], probs[support] * counts.sum()) > 1e-3
    assert second.sum() > 300 and second[2] > 0  # the accepted branch was exercised, EOS allowed there


def test_rejection_sampling_under_a_grammar_follows_the_masked_distribution(tiny_llama_smollm_vocab):
    """A constrained row's draft (regex [a-d][a-d], draft "b", "c"): the first emitted token
    follows p0 restricted to what the grammar allows first, the second, after "b" was accepted,
    p1 restricted to one more letter, and the third can only be the stop token. The allowed sets
    come from the tokens' own text, not from xgrammar."""
    import re

    from transformers import AutoTokenizer

    from llm_engine.structured_outputs import GrammarCompiler, StructuredOutputsParams

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_llama_smollm_vocab))
    vocab, trials = len(tokenizer), 2000
    grammar = GrammarCompiler(tokenizer, vocab, {tokenizer.eos_token_id}).compile(
        StructuredOutputsParams(regex="[a-d][a-d]"))
    pieces = tokenizer.convert_ids_to_tokens(list(range(vocab)))
    allowed = [torch.tensor([bool(re.fullmatch(pattern, piece)) for piece in pieces])
               for pattern in ("[a-d]{1,2}", "[a-d]")]
    b, c = tokenizer.convert_tokens_to_ids(["b", "c"])
    torch.manual_seed(0)
    logits = torch.randn(3, vocab) * 1.5
    logits[0, b] = logits[0, allowed[0]].max() - 0.3  # b is often rejected, often not
    seq = Request("x", None, [1], SamplingParams(temperature=0.8, seed=7), grammar=grammar).seqs[0]
    assert seq.grammar.check_draft([b, c]) == [b, c]
    expected = [Sampler._probs(logits[i].masked_fill(~allowed[i], float("-inf"))[None], [seq])[0] for i in (0, 1)]
    first, second = torch.zeros(vocab), torch.zeros(vocab)
    for tokens in verified_draws(logits, seq, [b, c], trials):
        first[tokens[0]] += 1
        if tokens[0] == b:
            second[tokens[1]] += 1
            if tokens[1] == c:
                assert tokens[2] == tokenizer.eos_token_id
    for counts, probs in ((first, expected[0]), (second, expected[1])):
        support = probs > 0
        assert counts[~support].sum() == 0  # nothing the grammar forbids
        assert chi_square_pvalue(counts[support], probs[support] * counts.sum()) > 1e-3
    assert second.sum() > 300  # the accepted branch was exercised


def test_metrics_export_vllm_spec_decode_counters(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", speculative_config=NGRAM)
    llm.generate([[5, 6, 7, 8] * 6], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    stats = llm.engine.get_stats()
    metrics = EngineMetrics("tiny")
    metrics.on_step(stats, [])
    text = metrics.render().decode()
    assert f'vllm:spec_decode_num_drafts_total{{model_name="tiny"}} {float(stats.spec_decode_num_drafts)}' in text
    assert (f'vllm:spec_decode_num_accepted_tokens_total{{model_name="tiny"}} '
            f'{float(stats.spec_decode_num_accepted_tokens)}') in text
    assert 'vllm:spec_decode_num_draft_tokens_total{model_name="tiny"}' in text
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="tiny",position="0"}' in text
    assert stats.spec_decode_num_drafts > 0
    assert stats.spec_decode_mean_acceptance_length == 1 + (stats.spec_decode_num_accepted_tokens
                                                            / stats.spec_decode_num_drafts)
