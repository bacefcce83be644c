"""The whole engine on CUDA against Transformers on the same GPU: float32 and bfloat16, CUDA graphs on
and off, batches, the prefix cache, and the KV pool sized by gpu_memory_utilization. Skipped
without a GPU (test_cuda_graphs.py checks the same logic on the CPU)."""

from __future__ import annotations

import gc
import random

import pytest
import torch
from conftest import VOCAB

from llm_engine import LLM, SamplingParams
from llm_engine.cuda_graphs import capture_sizes

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

NEW_TOKENS = 10
TOP = 5


def prompts() -> list[list[int]]:
    rng = random.Random(7)
    batch = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 45))] for _ in range(7)]
    return [*batch, batch[2][:32] + [5, 6]]  # its first two 16-token blocks can come from the prefix cache


def hf_greedy_on(model, prompt_list: list[list[int]]) -> list[list[int]]:
    out = []
    for prompt in prompt_list:
        with torch.no_grad():
            ids = model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=NEW_TOKENS,
                                 min_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
        out.append(ids[0, len(prompt):].tolist())
    return out


@pytest.fixture(scope="module")
def references(tiny_llama):
    from transformers import AutoModelForCausalLM

    refs = {}
    for dtype in ("float32", "bfloat16"):
        model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=getattr(torch, dtype)).cuda()
        refs[dtype] = hf_greedy_on(model, prompts())
    return refs


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("enforce_eager", [False, True])
def test_greedy_parity_with_transformers_on_cuda(tiny_llama, references, dtype, enforce_eager):
    """float32: the same tokens. bfloat16: near-ties may flip, as in vLLM's check: where a sequence
    first differs, Transformers' token is among our top 5, and most sequences are identical."""
    llm = LLM(model=str(tiny_llama), device="cuda", dtype=dtype, enforce_eager=enforce_eager, block_size=16,
              max_num_seqs=8, num_kv_blocks=256)
    runner = llm.engine.model_runner
    assert (runner.graphs is None) == enforce_eager
    if not enforce_eager:
        assert sorted(runner.graphs.graphs) == capture_sizes(8)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=TOP)
    llm.generate(prompts()[2], params, use_tqdm=False)  # the shared prefix is cached now
    outputs = llm.generate(prompts(), params, use_tqdm=False)
    assert outputs[-1].metrics.num_cached_tokens >= 32
    identical = 0
    for out, expected in zip(outputs, references[dtype]):
        ours = out.outputs[0]
        if ours.token_ids == expected:
            identical += 1
            continue
        assert dtype == "bfloat16", f"float32 differs: {ours.token_ids} vs {expected}"
        step = next(i for i, (a, b) in enumerate(zip(ours.token_ids, expected)) if a != b)
        assert expected[step] in ours.logprobs[step], f"step {step}: {expected[step]} not in our top {TOP}"
    assert identical >= len(outputs) - 2


def test_graph_replays_match_eager_steps(tiny_llama):
    """Padded graph replays (3 and 5 sequences in graphs of 4 and 8) give the eager logprobs."""
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    batch = prompts()[:5]
    results = []
    for eager in (False, True):
        llm = LLM(model=str(tiny_llama), device="cuda", dtype="float32", enforce_eager=eager, max_num_seqs=8,
                  num_kv_blocks=256)
        results.append([llm.generate(batch[:count], params, use_tqdm=False) for count in (3, 5)])
    for graph_run, eager_run in zip(*results):
        for ours, ref in zip(graph_run, eager_run):
            assert ours.outputs[0].token_ids == ref.outputs[0].token_ids
            for a, b in zip(ours.outputs[0].logprobs, ref.outputs[0].logprobs):
                token = next(iter(a))
                assert abs(a[token].logprob - b[token].logprob) < 1e-3


def test_the_kv_pool_grows_with_gpu_memory_utilization(tiny_llama):
    """The profiled sizing (the other tests fix num_kv_blocks): more share, more blocks, within the share."""
    gc.collect()  # earlier tests' engines, and their pools
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    sizes = []  # shares 2 and 3 GiB above what is in use (a tiny model's blocks are 4 KiB: not 100 GiB of them)
    for utilization in ((total - free + 2 * 1024**3) / total, (total - free + 3 * 1024**3) / total):
        llm = LLM(model=str(tiny_llama), device="cuda", dtype="bfloat16", gpu_memory_utilization=utilization,
                  enforce_eager=True)
        sizes.append(llm.engine.model_runner.num_blocks)
        assert torch.cuda.memory_allocated() <= utilization * total
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    assert 0 < sizes[0] < sizes[1]
    with pytest.raises(ValueError, match="^gpu_memory_utilization: "):
        LLM(model=str(tiny_llama), device="cuda", gpu_memory_utilization=1e-6)


def test_a_missing_cuda_device_index_is_a_clear_error(tiny_llama):
    index = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"^device: 'cuda:{index}' requested but this machine has"):
        LLM(model=str(tiny_llama), device=f"cuda:{index}")
