"""The native CPU decode kernel against the PyTorch reference backend, and how a backend is chosen."""

from __future__ import annotations

import random

import pytest
import torch

from llm_engine.config import EngineConfig
from llm_engine.layers import native
from llm_engine.layers.attention import NativePagedAttention, SeqSlice, TorchPagedAttention
from llm_engine.model_runner import make_attention_backend

NUM_BLOCKS, KV_HEADS, BLOCK_SIZE, DIM, HEADS = 256, 2, 16, 32, 6


def random_step(dtype: torch.dtype, new_tokens: list[int], seed: int = 0):
    """A pool with random contents and sequences whose blocks are scattered over it."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    k_cache = torch.randn(NUM_BLOCKS, KV_HEADS, BLOCK_SIZE, DIM, dtype=dtype)
    v_cache = torch.randn(NUM_BLOCKS, KV_HEADS, BLOCK_SIZE, DIM, dtype=dtype)
    free = list(range(NUM_BLOCKS))
    rng.shuffle(free)
    seqs = []
    for num_new in new_tokens:
        computed = rng.choice([0, 1, 15, 16, 17, 100, 200]) if num_new == 1 else rng.choice([0, 40])
        blocks = -(-(computed + num_new) // BLOCK_SIZE)
        seqs.append(SeqSlice(computed, num_new, [free.pop() for _ in range(blocks)]))
    tokens = sum(new_tokens)
    q = torch.randn(tokens, HEADS, DIM, dtype=dtype)
    k = torch.randn(tokens, KV_HEADS, DIM, dtype=dtype)
    v = torch.randn(tokens, KV_HEADS, DIM, dtype=dtype)
    return seqs, q, k, v, k_cache, v_cache


def run(backend, seqs, q, k, v, k_cache, v_cache) -> torch.Tensor:
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    metadata = backend.build_metadata(seqs, BLOCK_SIZE, torch.device("cpu"))
    return backend.forward(q, k, v, k_cache, v_cache, metadata, DIM ** -0.5)


@pytest.mark.parametrize("new_tokens", [[1] * 12, [1, 1, 30, 1, 7, 1]], ids=["decode-only", "mixed-step"])
def test_native_matches_reference_in_float32(new_tokens):
    step = random_step(torch.float32, new_tokens)
    expected = run(TorchPagedAttention(), *step)
    got = run(NativePagedAttention(), *step)
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)


def test_native_bfloat16_matches_reference_computed_in_float32():
    seqs, *tensors = random_step(torch.bfloat16, [1] * 10)
    expected = run(TorchPagedAttention(), seqs, *(t.float() for t in tensors))
    got = run(NativePagedAttention(), seqs, *tensors)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=2e-2)


def test_auto_picks_the_native_kernel_on_cpu_and_torch_on_request():
    assert isinstance(make_attention_backend(EngineConfig(model="m")), NativePagedAttention)
    backend = make_attention_backend(EngineConfig(model="m", attention_backend="torch"))
    assert type(backend) is TorchPagedAttention
    with pytest.raises(ValueError, match="^attention_backend: must be one of"):
        EngineConfig(model="m", attention_backend="flash")


def test_without_a_compiler_native_is_a_clear_error_and_auto_falls_back(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", "/bin/false")
    monkeypatch.setenv("CODEYARD_KERNEL_CACHE", str(tmp_path))
    native.load_kernels.cache_clear()
    try:
        with pytest.raises(ValueError, match="^attention_backend: the native kernel is unavailable"):
            make_attention_backend(EngineConfig(model="m", attention_backend="native"))
        assert type(make_attention_backend(EngineConfig(model="m"))) is TorchPagedAttention
    finally:
        native.load_kernels.cache_clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_whole_prompts_of_one_length_share_a_call_with_each_prompts_own_bits(dtype):
    """Adjacent whole prompts of one length go to one batched SDPA call; each prompt's rows are what
    a step holding it alone gives, bit for bit (a prompt's result does not depend on its batch)."""
    new_tokens = [1, 20, 20, 20, 7, 20, 20, 1, 33]
    seqs, q, k, v, k_cache, v_cache = random_step(dtype, new_tokens, seed=3)
    for i in (1, 2, 3, 5, 6):  # whole prompts (random_step gives some 40 cached tokens); 8 may have them
        seqs[i].num_computed = 0
    backend = NativePagedAttention()
    metadata = backend.build_metadata(seqs, BLOCK_SIZE, torch.device("cpu"))
    runs = [[c.query_len for c in run] for run in metadata.prefill_runs()]
    assert [20, 20, 20] in runs and [20, 20] in runs and sum(map(len, runs)) == len(metadata.prefills)
    got = run(backend, seqs, q, k, v, k_cache, v_cache)
    start = 0
    for s, n in zip(seqs, new_tokens):
        rows = slice(start, start + n)
        alone = run(backend, [s], q[rows], k[rows], v[rows], k_cache, v_cache)
        assert torch.equal(got[rows], alone), f"rows {rows}"
        start += n
