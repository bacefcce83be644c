"""The Triton attention kernels against the PyTorch reference backend, and the engine on them.

Without CUDA the kernels run on CPU tensors in Triton's interpreter (tests/llm_engine/triton_interpret.py
sets TRITON_INTERPRET=1 before any kernel module is imported); with a GPU the same tests run compiled
on it, and the CUDA-only tests add Llama-3-8B-sized shapes. The interpreter runs every program of a
grid op by op in numpy (~30 ms each), so the CPU shapes are tiny.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from triton_interpret import CUDA, DEVICES

from llm_engine import LLM, SamplingParams
from llm_engine.config import EngineConfig
from llm_engine.kernels import attention as attention_kernels
from llm_engine.kernels import kv_cache as kv_cache_kernels
from llm_engine.layers.attention import SeqSlice, TorchPagedAttention
from llm_engine.layers.attention_triton import TritonPagedAttention
from llm_engine.model_runner import make_attention_backend

BLOCK_SIZE, HEAD_DIM, NUM_BLOCKS = 4, 12, 40  # head_dim 12: not a power of two
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


def scattered_slices(steps: list[tuple[int, int]], block_size: int, num_blocks: int, seed: int = 0) -> list[SeqSlice]:
    """(tokens already cached, new tokens) per sequence, over blocks taken in random order from the pool."""
    rng = random.Random(seed)
    free = list(range(num_blocks))
    rng.shuffle(free)
    return [SeqSlice(computed, new, [free.pop() for _ in range(-(-(computed + new) // block_size))])
            for computed, new in steps]


def random_tensors(device: str, num_tokens: int, heads: int, kv_heads: int, dtype: torch.dtype,
                   head_dim: int = HEAD_DIM, block_size: int = BLOCK_SIZE,
                   num_blocks: int = NUM_BLOCKS) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    shapes = {"q": (num_tokens, heads, head_dim), "k": (num_tokens, kv_heads, head_dim),
              "v": (num_tokens, kv_heads, head_dim), "k_cache": (num_blocks, kv_heads, block_size, head_dim),
              "v_cache": (num_blocks, kv_heads, block_size, head_dim)}
    return {name: torch.randn(shape).to(dtype).to(device) for name, shape in shapes.items()}


def run_backend(backend, slices: list[SeqSlice], tensors: dict[str, torch.Tensor],
                block_size: int = BLOCK_SIZE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's forward on copies of the caches: (output, k_cache, v_cache) after the step."""
    k_cache, v_cache = tensors["k_cache"].clone(), tensors["v_cache"].clone()
    metadata = backend.build_metadata(slices, block_size, k_cache.device)
    head_dim = tensors["q"].shape[-1]
    out = backend.forward(tensors["q"], tensors["k"], tensors["v"], k_cache, v_cache, metadata, head_dim ** -0.5)
    return out, k_cache, v_cache


@pytest.mark.parametrize("device", DEVICES)
def test_kv_cache_write_matches_reference_and_skips_negative_slots(device):
    torch.manual_seed(0)
    qkv = torch.randn(5, 2 * 3 + 4, HEAD_DIM, device=device)  # k and v as views of a fused projection
    k, v = qkv[:, 4:7], qkv[:, 7:10]
    slots = torch.tensor([0, 7, -1, 13, 4 * 9 + 3], device=device)
    k_cache, v_cache = (torch.randn(10, 3, 4, HEAD_DIM, device=device) for _ in range(2))
    caches = [k_cache, v_cache, k_cache.clone(), v_cache.clone()]
    kv_cache_kernels.reshape_and_cache(k, v, caches[0], caches[1], slots)
    kv_cache_kernels.reshape_and_cache_reference(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert torch.equal(caches[0][3, :, 1], k[3]) and torch.equal(caches[0][9, :, 3], k[4])  # 13 = 3 * 4 + 1


# With blocks of 4: decodes ending exactly on a block boundary (7 + 1 = 8) and one token into a new
# block (8 + 1), a first chunk crossing blocks, a later chunk crossing blocks over its cached prefix,
# and a decode whose context takes two BLOCK_N steps of the kernel.
MIXED_STEP = [(7, 1), (8, 1), (0, 6), (3, 7), (37, 1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("heads,kv_heads,block_size", [(3, 3, 4), (4, 2, 16), (8, 2, 4), (5, 1, 5)],
                         ids=["mha", "gqa2-blocks-of-16", "gqa4", "mqa-blocks-of-5"])
def test_mixed_batch_matches_reference(device, heads, kv_heads, block_size):
    slices = scattered_slices(MIXED_STEP, block_size, NUM_BLOCKS)
    tensors = random_tensors(device, sum(new for _, new in MIXED_STEP), heads, kv_heads, torch.float32,
                             block_size=block_size)
    expected, expected_k, expected_v = run_backend(TorchPagedAttention(), slices, tensors, block_size)
    got, got_k, got_v = run_backend(TritonPagedAttention(), slices, tensors, block_size)
    assert torch.equal(got_k, expected_k) and torch.equal(got_v, expected_v)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_caches_match_reference_computed_in_float32(device, dtype):
    slices = scattered_slices([(5, 1), (2, 5)], BLOCK_SIZE, NUM_BLOCKS)
    tensors = random_tensors(device, 6, 4, 2, dtype)
    expected, _, _ = run_backend(TorchPagedAttention(), slices, {n: t.float() for n, t in tensors.items()})
    got, _, _ = run_backend(TritonPagedAttention(), slices, tensors)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=2e-2)


def decode_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slices: list[SeqSlice],
                     block_size: int, scale: float) -> torch.Tensor:
    reference = TorchPagedAttention()
    metadata = reference.build_metadata(slices, block_size, q.device)
    return reference.decode(q, k_cache, v_cache, metadata, scale)


def decode_inputs(device: str, context_lens: list[int], heads: int, kv_heads: int, dtype: torch.dtype,
                  head_dim: int, block_size: int, num_blocks: int):
    slices = scattered_slices([(n - 1, 1) for n in context_lens], block_size, num_blocks)
    tensors = random_tensors(device, len(context_lens), heads, kv_heads, dtype, head_dim, block_size, num_blocks)
    width = max(len(s.block_table) for s in slices)
    tables = torch.tensor([s.block_table + [0] * (width - len(s.block_table)) for s in slices],
                          dtype=torch.int32, device=device)
    lens = torch.tensor(context_lens, dtype=torch.int32, device=device)
    return slices, tensors, tables, lens


@pytest.mark.parametrize("device", DEVICES)
def test_split_k_decode_matches_single_pass_and_reference(device):
    # 9 tokens in 3 partitions of whole 32-key steps leaves two partitions empty
    slices, t, tables, lens = decode_inputs(device, [70, 33, 9], 4, 2, torch.float32, HEAD_DIM, BLOCK_SIZE,
                                            NUM_BLOCKS)
    scale = HEAD_DIM ** -0.5
    expected = decode_reference(t["q"], t["k_cache"], t["v_cache"], slices, BLOCK_SIZE, scale)
    single = attention_kernels.paged_decode(t["q"], t["k_cache"], t["v_cache"], tables, lens, scale, num_splits=1)
    split = attention_kernels.paged_decode(t["q"], t["k_cache"], t["v_cache"], tables, lens, scale, num_splits=3)
    torch.testing.assert_close(single, expected, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(split, single, atol=2e-6, rtol=1e-5)


def test_split_k_is_chosen_for_few_long_decodes_only():
    def splits(query_lens: list[int], seq_lens: list[int], kv_heads: int = 2) -> int:
        batch = attention_kernels.PagedBatch.build(query_lens, seq_lens, [[0]] * len(seq_lens), torch.device("cpu"))
        return attention_kernels.choose_splits(batch, kv_heads, torch.device("cpu"))

    assert splits([1], [4096]) > 1
    assert splits([1], [100]) == 1  # short context: one pass
    assert splits([1] * 64, [4096] * 64) == 1  # enough programs already
    assert splits([1, 30], [4096, 30]) == 1  # not decode-only


def test_triton_is_auto_on_cuda_and_a_clear_error_on_the_cpu_without_the_interpreter(monkeypatch):
    backend = make_attention_backend(EngineConfig(model="m", device="cuda"))  # not loaded: no GPU needed
    assert isinstance(backend, TritonPagedAttention)
    monkeypatch.setattr(attention_kernels, "INTERPRETED", False)
    with pytest.raises(ValueError, match="^attention_backend: 'triton' runs on the CPU only under the Triton"):
        EngineConfig(model="m", attention_backend="triton")


GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=0)


def engine_run(model: str, device: str, backend: str, prompts: list[list[int]], repeat: list[int]):
    """Two prompts in a pool of 7 blocks of 4: the first's decode preempts the second; then a
    prompt whose first 8 tokens are the second's, found in the prefix cache."""
    llm = LLM(model=model, dtype="float32", block_size=4, num_kv_blocks=7, attention_backend=backend, device=device)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    again = llm.generate([repeat], GREEDY, use_tqdm=False)
    return outputs + again


@pytest.mark.parametrize("device", DEVICES)
def test_engine_greedy_tokens_match_the_torch_backend(device, tiny_llama):
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (9, 14)]
    repeat = prompts[1][:8] + [7, 8, 9]
    expected = engine_run(str(tiny_llama), device, "torch", prompts, repeat)
    got = engine_run(str(tiny_llama), device, "triton", prompts, repeat)
    assert sum(o.metrics.num_preemptions for o in got) > 0
    assert got[-1].metrics.num_cached_tokens == 8
    for ours, theirs in zip(got, expected):
        assert ours.outputs[0].token_ids == theirs.outputs[0].token_ids
        for token, ours_top, theirs_top in zip(ours.outputs[0].token_ids, ours.outputs[0].logprobs,
                                               theirs.outputs[0].logprobs):
            assert abs(ours_top[token].logprob - theirs_top[token].logprob) < 1e-4


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_long_decodes_match_reference(dtype):
    """Llama-3-8B's attention shape (32 heads, 8 kv heads, head_dim 128, blocks of 16) over 2k-token
    contexts: split-K as the dispatcher picks it, and forced off."""
    contexts = [2048, 1500, 17, 2000, 16]
    slices, t, tables, lens = decode_inputs("cuda", contexts, 32, 8, dtype, 128, 16, 1024)
    expected = decode_reference(t["q"].float(), t["k_cache"].float(), t["v_cache"].float(), slices, 16, 128 ** -0.5)
    auto = attention_kernels.paged_decode(t["q"], t["k_cache"], t["v_cache"], tables, lens, 128 ** -0.5)
    single = attention_kernels.paged_decode(t["q"], t["k_cache"], t["v_cache"], tables, lens, 128 ** -0.5, 1)
    torch.testing.assert_close(auto.float(), expected, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(single.float(), expected, atol=1e-2, rtol=1e-2)


@needs_cuda
def test_cuda_mixed_batch_with_long_chunks_matches_reference():
    steps = [(0, 300), (1000, 1), (513, 130), (15, 1), (0, 1)]
    slices = scattered_slices(steps, 16, 1024)
    tensors = random_tensors("cuda", sum(n for _, n in steps), 32, 8, torch.bfloat16, 128, 16, 1024)
    expected, expected_k, _ = run_backend(TorchPagedAttention(), slices, tensors, block_size=16)
    got, got_k, _ = run_backend(TritonPagedAttention(), slices, tensors, block_size=16)
    assert torch.equal(got_k, expected_k)
    torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=2e-2)



@pytest.mark.skipif(os.environ.get("CODEYARD_TRITON_COMPILE") != "1",
                    reason="compiles the kernels for CUDA GPUs (minutes of CPU): make test-triton-compile")
@pytest.mark.parametrize("arch", [80, 90])
def test_kernels_compile_for_cuda_gpus_without_one(arch):
    """Triton's compiler and ptxas need no GPU; they run in a process of their own, since in this
    one Triton's library functions (tl.max...) were defined for the interpreter."""
    script = Path(__file__).with_name("triton_compile_check.py")
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(Path(__file__).parents[2])}
    result = subprocess.run([sys.executable, str(script), str(arch)], env=env, capture_output=True, text=True,
                            timeout=1200)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"sm_{arch}: all kernels compiled" in result.stdout
