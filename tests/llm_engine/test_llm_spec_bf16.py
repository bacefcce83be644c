"""Speculative verification in bfloat16 (dtype="auto" on AMX/AVX512-BF16 CPUs), where a step runs
layer by layer: a draft's rows attend through the decode kernel as one-token steps would
(`SeqSlice.as_decodes`), so each row's logits are that step's bit for bit and greedy speculation
returns exactly the tokens decoding without it does."""

from __future__ import annotations

import torch
from conftest import VOCAB
from test_llm_spec_fused import KINDS, NGRAM, PROMPT, step

from llm_engine import LLM, SamplingParams


def engine(model, kind: str, **extra) -> LLM:
    """One thread: a tiny model's layer-by-layer step on two waits on OpenMP hand-offs (seconds on a busy machine)."""
    return LLM(model=str(model), dtype="bfloat16", quantization=KINDS[kind], block_size=4, kv_cache_memory="4MiB",
               enable_prefix_caching=False, num_threads=1, **extra)


def test_a_bf16_draft_steps_logits_are_the_one_token_steps_bit_for_bit(tiny_llama):
    runner = engine(tiny_llama, "q4_1").engine.model_runner
    runner.decode_stack = None  # the per-layer path (a batch's; one sequence's takes the fused step)
    table = list(range(12))
    tokens = [int(t) for t in torch.randint(3, VOCAB, (23,), generator=torch.Generator().manual_seed(5))]
    start, drafted = 17, tokens[17:]
    with torch.inference_mode():
        runner.run_step(step(tokens[:start], 0, table))  # the prompt, one causal chunk
        alone = torch.cat([runner.run_step(step([token], start + i, table))[0] for i, token in enumerate(drafted)])
        verify = step(drafted, start, table)
        verify.slices[0].as_decodes = True
        together = runner.run_step(verify)[0]
    assert torch.equal(together, alone)


def test_greedy_speculation_in_bf16_gives_the_plain_decode_tokens_and_logprobs(tiny_llama):
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, logprobs=1)
    plain = engine(tiny_llama, "q4_1").generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    spec = engine(tiny_llama, "q4_1", speculative_config=NGRAM)
    ours = spec.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    assert spec.engine.get_stats().spec_decode_num_accepted_tokens > 0
    assert ours.token_ids == plain.token_ids
    assert ours.logprobs == plain.logprobs
