"""The CUDA path's logic on the CPU: graph sizes and padding, the padded decode over the graphs'
static buffers (run eagerly here: the same inputs a captured graph replays), the profiled KV
sizing, and the configuration's errors. The runs on a GPU are in test_cuda_engine.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import VOCAB
from triton_interpret import INTERPRETED

import llm_engine
from llm_engine import LLM, SamplingParams
from llm_engine.config import EngineConfig
from llm_engine.cuda_graphs import capture_sizes, padded_size
from llm_engine.gpu_memory import MemoryProfile, kv_cache_bytes

GIB = 1024**3


def test_capture_sizes_are_small_powers_then_steps_of_16_up_to_max_num_seqs():
    assert capture_sizes(1) == [1]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(256) == [1, 2, 4, 8, *range(16, 257, 16)]
    sizes = capture_sizes(40)
    assert [padded_size(n, sizes) for n in (1, 3, 5, 9, 16, 17, 33, 40, 41)] == [1, 4, 8, 16, 16, 32, 40, 40, None]


def with_decode_graphs(llm: LLM) -> LLM:
    """Route the engine's decode steps through the graphs' static buffers (eager on the CPU), with
    the scratch block the CUDA runner allocates past the pool for the padding rows."""
    runner = llm.engine.model_runner
    runner._allocate_kv_cache(llm.engine.config, runner.num_blocks, extra_blocks=1)
    runner.graphs = runner.decode_graphs(llm.engine.config)
    return llm


@pytest.mark.parametrize("backend, count", [("torch", 6), pytest.param("triton", 3, marks=pytest.mark.skipif(
    not INTERPRETED, reason="Triton on CPU tensors needs TRITON_INTERPRET=1"))])
def test_padded_decodes_over_the_static_buffers_match_eager_decodes(tiny_llama, backend, count):
    """A batch of 6 (or 3: the interpreted Triton backend is slow) pads to 8 (or 4), the last
    prompt's first blocks come from the prefix cache; the same greedy tokens and logprobs as the
    reference backend's plain steps, and the same pool (padding rows write only the scratch block
    past it)."""
    prompts = [[(7 * i + j) % (VOCAB - 3) + 3 for j in range(5 + 3 * i)] for i in range(count - 1)]
    prompts.append(prompts[-1][:9] + [11, 12])  # shares a cached block with the prompt before it
    params = SamplingParams(temperature=0, max_tokens=5 if count > 4 else 3, ignore_eos=True, logprobs=0)
    kwargs = dict(model=str(tiny_llama), dtype="float32", block_size=4, num_kv_blocks=64, max_num_seqs=8)
    plain = LLM(**kwargs, attention_backend="torch")
    expected = plain.generate(prompts, params, use_tqdm=False)
    llm = with_decode_graphs(LLM(**kwargs, attention_backend=backend))
    graphs = llm.engine.model_runner.graphs
    graphs.warmup_inputs()  # what capture runs first: long contexts left in the buffers
    graphs.forward(1)
    sizes_run = []
    run = llm.engine.model_runner.graphs.run
    llm.engine.model_runner.graphs.run = lambda step: sizes_run.append(len(step.slices)) or run(step)
    got = llm.generate(prompts, params, use_tqdm=False)
    for ours, ref in zip(got, expected):
        assert ours.outputs[0].token_ids == ref.outputs[0].token_ids
        for a, b in zip(ours.outputs[0].logprobs, ref.outputs[0].logprobs):
            token = next(iter(a))
            assert abs(a[token].logprob - b[token].logprob) < 1e-4
    assert count in sizes_run  # a batch that was padded
    pool = llm.engine.model_runner.kv_cache
    torch.testing.assert_close(pool[:, :, :-1], plain.engine.model_runner.kv_cache, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not INTERPRETED, reason="Triton on CPU tensors needs TRITON_INTERPRET=1")
@pytest.mark.skipif(not (Path(llm_engine.__file__).parent / "kernels" / "attention.py").exists(),
                    reason="the Triton attention kernels are not in this tree yet")
def test_graph_split_count_is_right_for_short_contexts():
    """Graphs fix the Triton decode's split count at capture (for the longest context); contexts
    far shorter than the splits leave partitions empty, which must not change the result."""
    from llm_engine.kernels.attention import PagedBatch, paged_attention

    torch.manual_seed(0)
    block_size, heads, kv_heads, dim = 4, 4, 2, 16
    k_cache = torch.randn(12, kv_heads, block_size, dim)
    v_cache = torch.randn(12, kv_heads, block_size, dim)
    q = torch.randn(3, heads, dim)
    batch = PagedBatch.build([1, 1, 1], [1, 5, 19], [[3], [4, 7], [0, 1, 2, 5, 6]], torch.device("cpu"))
    one = paged_attention(q, k_cache, v_cache, batch, 0.25, num_splits=1)
    many = paged_attention(q, k_cache, v_cache, batch, 0.25, num_splits=8)
    torch.testing.assert_close(many, one, atol=1e-5, rtol=1e-5)


def test_profile_step_runs_the_largest_prefill_over_a_scratch_pool(tiny_llama):
    """The forward the CUDA runner measures, on the CPU: sequences no longer than the model's
    512 positions, a scratch pool just big enough; the runner's own pool is untouched."""
    llm = LLM(model=str(tiny_llama), dtype="float32", block_size=16, num_kv_blocks=8, max_num_batched_tokens=1100)
    runner = llm.engine.model_runner
    pool = runner.kv_cache
    scratch = runner.profile_step(llm.engine.config)
    per_block = 2 * 2 * 16 * 2 * 16 * 4  # K and V, 2 layers, 16 tokens, 2 kv heads, head_dim 16, float32
    assert scratch == (32 + 32 + 5) * per_block  # 512 + 512 + 76 tokens
    runner._bind_kv_cache(pool)
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2


def test_kv_budget_is_the_share_left_after_weights_activations_and_non_torch_memory():
    profile = MemoryProfile(total=100 * GIB, used_before=1 * GIB, peak_torch=20 * GIB, non_torch=2 * GIB,
                            free_after=70 * GIB)
    assert kv_cache_bytes(profile, 0.9) == 68 * GIB
    with pytest.raises(ValueError, match=r"^gpu_memory_utilization: 0.2 of 100.0 GiB leaves nothing"):
        kv_cache_bytes(profile, 0.2)
    crowded = MemoryProfile(total=100 * GIB, used_before=40 * GIB, peak_torch=20 * GIB, non_torch=0,
                            free_after=40 * GIB)
    with pytest.raises(ValueError, match=r"^gpu_memory_utilization: 0.9 asks for 70.0 GiB .* only 40.0 GiB is free"):
        kv_cache_bytes(crowded, 0.9)


@pytest.mark.parametrize("field, value", [("gpu_memory_utilization", 0), ("gpu_memory_utilization", 1.5),
                                          ("gpu_memory_utilization", "0.9"), ("gpu_memory_utilization", True),
                                          ("enforce_eager", "yes")])
def test_bad_gpu_options_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}:"):
        EngineConfig(model="m", **{field: value})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_a_clear_error(tiny_llama):
    with pytest.raises(ValueError, match=r"^device: 'cuda' requested but CUDA is not available"):
        LLM(model=str(tiny_llama), device="cuda", attention_backend="torch")


@pytest.mark.parametrize("value", ["0", "1.5", "most"])
def test_the_servers_gpu_memory_option_is_checked_on_the_command_line(value):
    from typer.testing import CliRunner

    from llm_engine.cli import app

    result = CliRunner().invoke(app, ["serve", "--gpu-memory-utilization", value, "--enforce-eager"])
    assert result.exit_code == 2
    assert "--gpu-memory-utilization" in result.output
