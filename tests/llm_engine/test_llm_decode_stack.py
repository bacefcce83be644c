"""The fused decode step (layers/decode_stack.py) against the layer-by-layer path:
the same kernels in the same order, so the same greedy tokens and the same logprobs, bit for bit."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny_model, drafted_after_prefix
from test_llm_spec_fused import step

from llm_engine import LLM, SamplingParams
from llm_engine.layers.decode_stack import DecodeStack

PROMPT = [5, 6, 7, 8, 9, 10, 11]
PARAMS = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)


def fused_and_layered(llm: LLM):
    runner = llm.engine.model_runner
    stack = runner.decode_stack
    assert stack is not None
    fused = llm.generate([PROMPT], PARAMS, use_tqdm=False)[0].outputs[0]
    runner.decode_stack = None
    try:
        layered = llm.generate([PROMPT], PARAMS, use_tqdm=False)[0].outputs[0]
    finally:
        runner.decode_stack = stack
    return fused, layered


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory):
    return build_tiny_model("Qwen2ForCausalLM", tmp_path_factory.mktemp("tiny-qwen2"))  # q/k/v biases


@pytest.mark.parametrize("arch, quantization", [
    ("llama", "int4"),  # group 32 asym: the GGUF Q4_1 layout
    ("llama", "fp8"),
    ("qwen2", "w8a8"),  # int8 weights, activations rounded to int8; q/k/v biases
])
def test_fused_decode_equals_layer_by_layer(tiny_llama, tiny_qwen2, arch, quantization):
    llm = LLM(model=str(tiny_llama if arch == "llama" else tiny_qwen2), dtype="float32", quantization=quantization,
              kv_cache_memory="8MiB", block_size=4,  # small blocks: the table grows
              enable_prefix_caching=False)  # (a cached prompt would be computed differently)
    fused, layered = fused_and_layered(llm)
    assert fused.token_ids == layered.token_ids
    assert fused.logprobs == layered.logprobs


def test_unquantized_models_stay_layer_by_layer(tiny_llama):
    llm = LLM(model=str(tiny_llama), dtype="float32", quantization=None, kv_cache_memory="8MiB")
    assert llm.engine.model_runner.decode_stack is None  # float weights: the fused step needs packed ones


def test_a_batch_steps_fused_each_row_as_its_sequence_alone(tiny_llama, monkeypatch):
    """A batch's decode steps (one token per sequence, each its own positions and blocks) take the
    fused step: each sequence's tokens and logprobs are bit for bit the per-layer batch's (float32:
    the same kernels), and its tokens are its own alone (the prompts' prefill differs: one chunk of
    three prompts against one each)."""
    llm = LLM(model=str(tiny_llama), dtype="float32", quantization="int4", kv_cache_memory="8MiB", block_size=4,
              enable_prefix_caching=False)
    prompts = [PROMPT, [3, 4], list(range(20, 33))]  # different lengths: positions and tables differ by row
    alone = [llm.generate([p], PARAMS, use_tqdm=False)[0].outputs[0] for p in prompts]
    widths: list[int] = []  # rows per fused step
    rows = DecodeStack.rows
    monkeypatch.setattr(DecodeStack, "rows", lambda self, ids, *rest: widths.append(len(ids)) or rows(self, ids, *rest))
    widths.clear()
    fused = [o.outputs[0] for o in llm.generate(prompts, PARAMS, use_tqdm=False)]
    assert max(widths) == len(prompts)
    runner, stack = llm.engine.model_runner, llm.engine.model_runner.decode_stack
    runner.decode_stack = None
    try:
        layered = [o.outputs[0] for o in llm.generate(prompts, PARAMS, use_tqdm=False)]
    finally:
        runner.decode_stack = stack
    for ours, one, theirs in zip(fused, alone, layered, strict=True):
        assert ours.token_ids == one.token_ids == theirs.token_ids
        assert ours.logprobs == theirs.logprobs


def test_a_bf16_model_steps_fused_on_its_bf16_cache(tiny_llama):
    """dtype="auto" on a CPU with native bf16: the fused step runs on the bf16 KV cache (its int4 g32
    layers on the AMX bf16 few-row kernel where the CPU has one, float32 arithmetic otherwise). A draft's rows are its one-token steps bit for bit (what speculation needs), and the
    per-layer bf16 path (a batch's) agrees to its bf16 roundings: same greedy tokens."""
    llm = LLM(model=str(tiny_llama), dtype="bfloat16", quantization="int4", kv_cache_memory="8MiB", block_size=4,
              enable_prefix_caching=False, num_threads=1)
    runner = llm.engine.model_runner
    stack, table = runner.decode_stack, list(range(12))
    assert stack is not None and runner.kv_cache.dtype == torch.bfloat16
    start = 17
    with torch.inference_mode():
        drafted, fused, alone = drafted_after_prefix(stack, table, start)
        fused_logits = runner.run_step(step(drafted, start, table))[0]
        runner.decode_stack = None
        layered = step(drafted, start, table)
        layered.slices[0].as_decodes = True  # a bf16 draft's rows attend as one-token steps do
        layered_logits = runner.run_step(layered)[0]
        runner.decode_stack = stack
    assert fused.dtype == fused_logits.dtype == layered_logits.dtype == torch.bfloat16
    assert torch.equal(fused, alone)
    torch.testing.assert_close(fused_logits, layered_logits, atol=0.1, rtol=0.02)
    fused_out, layered_out = fused_and_layered(llm)
    assert fused_out.token_ids == layered_out.token_ids
