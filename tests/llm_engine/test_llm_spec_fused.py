"""Speculative verification through the fused decode step (layers/decode_stack.py): the next token
and its draft in one native pass, each token's hidden state bit for bit the one-token step's;
greedy output identical to decoding without speculation and to the layer-by-layer path."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB, int4_rounds_activations

from llm_engine import LLM, SamplingParams
from llm_engine.layers.attention import SeqSlice
from llm_engine.layers.decode_stack import DecodeStack
from llm_engine.layers.native import cpu_kernels
from llm_engine.layers.quantization import QuantScheme, pack_int4, quantize_int4, quantize_int8
from llm_engine.model_runner import StepInput

# GGUF's block layouts (Q4_1, Q4_0, Q8_0: the few-row g32 kernels), int4 g64 (the few-row kernel:
# int16-rounded activations in AVX2 builds, the table kernel in AVX-512 ones), fp8 (the buffered
# kernel), and int8-rounded activations (the integer kernels)
KINDS = {"q4_1": {"method": "int4", "group_size": 32, "symmetric": False},
         "q4_0": {"method": "int4", "group_size": 32, "symmetric": True},
         "q8_0": {"method": "int8", "group_size": 32},
         "int4-g64": {"method": "int4", "group_size": 64, "symmetric": False},
         "fp8": "fp8", "w4a8": "w4a8"}
PROMPT = [31, 49, 46, 187, 89, 160] * 3  # the tiny model answers with runs of repeats: drafts get accepted
NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3}


def engine(model, kind: str, **extra) -> LLM:
    return LLM(model=str(model), dtype="float32", quantization=KINDS[kind], block_size=4, kv_cache_memory="4MiB",
               enable_prefix_caching=False, **extra)


def step(tokens: list[int], start: int, table: list[int]) -> StepInput:
    """A decode step of one sequence: tokens[0] its next token, the rest a draft (all rows sampled)."""
    rows = list(range(len(tokens)))
    return StepInput(tokens, [start + i for i in rows], [SeqSlice(start, len(tokens), table)], rows, [], [])


@pytest.mark.parametrize("kind", KINDS)
def test_a_draft_step_is_the_one_token_steps_bit_for_bit_and_the_layered_step_to_rounding(tiny_llama, kind):
    runner = engine(tiny_llama, kind).engine.model_runner
    stack, table = runner.decode_stack, list(range(12))
    assert stack is not None
    tokens = [int(t) for t in torch.randint(3, VOCAB, (30,), generator=torch.Generator().manual_seed(5))]
    start, drafted = 17, tokens[17:30]  # 13 tokens from position 17: blocks 4..7 of 4 slots
    with torch.inference_mode():
        for position, token in enumerate(tokens[:start]):
            stack([token], position, table)
        fused = stack(drafted, start, table).clone()
        alone = torch.cat([stack([token], start + i, table) for i, token in enumerate(drafted)])
        fused_logits = runner.run_step(step(drafted, start, table))[0]
        runner.decode_stack = None
        layered_logits = runner.run_step(step(drafted, start, table))[0]
    if kind == "w4a8":  # the integer kernels' multi-row path sums in another order
        torch.testing.assert_close(fused, alone, atol=1e-5, rtol=1e-5)
    else:
        assert torch.equal(fused, alone)
    # Both paths run the same kernels; their other ops round apart by ~1e-7, which moves a few of
    # the int16 roundings of activations where the int4 kernel makes them (up to ~8e-4 seen here).
    atol = 2e-3 if int4_rounds_activations() and kind.startswith(("q4", "int4")) else 2e-5
    torch.testing.assert_close(fused_logits, layered_logits, atol=atol, rtol=1e-5)
    assert torch.equal(fused_logits.argmax(-1), layered_logits.argmax(-1))


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_greedy_speculation_through_the_fused_step_gives_the_plain_decode_tokens(tiny_llama, kind, monkeypatch):
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, logprobs=1)
    plain = engine(tiny_llama, kind).generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    spec = engine(tiny_llama, kind, speculative_config=NGRAM)
    widths: list[int] = []  # tokens per fused step
    call = DecodeStack.rows
    monkeypatch.setattr(DecodeStack, "rows", lambda self, ids, *rest: widths.append(len(ids)) or call(self, ids, *rest))
    fused = spec.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    spec.engine.model_runner.decode_stack = None
    layered = spec.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    assert max(widths) > 1 and spec.engine.get_stats().spec_decode_num_accepted_tokens > 0
    assert fused.token_ids == plain.token_ids == layered.token_ids
    for ours, theirs in zip(fused.logprobs, plain.logprobs, strict=True):
        assert ours.keys() == theirs.keys()
        assert all(abs(ours[t].logprob - theirs[t].logprob) < 1e-5 for t in ours)


@pytest.mark.parametrize("scheme", [QuantScheme("int4", 32, False), QuantScheme("int8", 32)], ids=QuantScheme.describe)
def test_few_row_kernel_gives_each_row_its_one_row_result(scheme):
    """GGUF's Q4/Q8 shape (the SmolLM2 layers and its Q8_0 LM head): up to 16 rows, each row's
    bits do not depend on the rows beside it, so verified logits are the decode step's."""
    torch.manual_seed(0)
    weight = torch.randn(96, 320) * 0.05
    if scheme.weights == "int4":
        codes, scales, offsets = quantize_int4(weight, 32, symmetric=False)
        qweight = pack_int4(codes, 32)
    else:
        (qweight, scales), offsets = quantize_int8(weight, 32), None
    native = cpu_kernels()
    assert native is not None
    x = torch.randn(16, 320)
    ones = torch.cat([native.quant_gemm(x[i:i + 1], qweight, scales, offsets, 32) for i in range(16)])
    for rows in (2, 6, 8, 9, 16):
        assert torch.equal(native.quant_gemm(x[:rows], qweight, scales, offsets, 32), ones[:rows])
