"""Sampling on the device: the Triton penalties kernel against the CPU sampler's penalties (under the
interpreter on the CPU, compiled on a GPU), and on a GPU the whole sampler against the CPU one."""

from __future__ import annotations

import random

import pytest
import torch
from triton_interpret import DEVICES

from llm_engine import SamplingParams
from llm_engine.sampler import Sampler
from llm_engine.sequence import Request

VOCAB = 1500  # two of the kernel's 1024-wide column blocks, the second one partly masked


def make_seq(output: list[int], prompt: list[int], **params):
    request = Request("x", None, prompt, SamplingParams(**params))
    seq = request.seqs[0]
    seq.token_ids += output
    return seq


def penalised_seqs(rng: random.Random) -> list:
    """Every penalty alone and together, none at all, repeats, and ids outside the vocabulary."""
    cases = [dict(repetition_penalty=1.7), dict(repetition_penalty=0.6), dict(frequency_penalty=0.4),
             dict(presence_penalty=-1.1), dict(repetition_penalty=1.3, frequency_penalty=-0.5, presence_penalty=0.8),
             dict()]
    seqs = []
    for params in cases:
        output = [rng.randrange(VOCAB) for _ in range(rng.randint(0, 30))] + [5, 5, 5, VOCAB + 3]
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))] + [VOCAB + 7]
        seqs.append(make_seq(output, prompt, temperature=0.8, **params))
    return seqs


@pytest.mark.parametrize("device", DEVICES)
def test_the_penalties_kernel_matches_the_cpu_sampler(device):
    rng = random.Random(3)
    seqs = penalised_seqs(rng)
    logits = torch.randn(len(seqs), VOCAB, generator=torch.Generator().manual_seed(0)) * 4
    expected = logits.clone()
    Sampler._apply_penalties(expected, seqs)
    on_device = logits.to(device)
    Sampler._apply_penalties_on_device(on_device, seqs)
    torch.testing.assert_close(on_device.cpu(), expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(on_device[-1].cpu(), logits[-1])  # the row without penalties is untouched


@pytest.mark.parametrize("device", DEVICES)
def test_penalty_tables_count_outputs_and_mark_prompts(device):
    from llm_engine.kernels.sampling import penalty_tables

    counts, prompt = penalty_tables([[1, 1, 4, 9], [], [2]], [[3], [0, 4, 20], []], 10, torch.device(device))
    assert counts.tolist() == [[0, 2, 0, 0, 1, 0, 0, 0, 0, 1], [0] * 10, [0, 0, 1] + [0] * 7]
    assert prompt.tolist() == [[0, 0, 0, 1] + [0] * 6, [1, 0, 0, 0, 1] + [0] * 5, [0] * 10]


CUDA_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@CUDA_ONLY
def test_sampling_on_cuda_keeps_the_cpu_samplers_semantics():
    """Greedy (with penalties) picks what the CPU picks; the filtered distributions are the CPU's;
    a seeded request draws the same tokens twice on the device."""
    rng = random.Random(5)
    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(1)) * 3
    greedy = [make_seq([rng.randrange(VOCAB) for _ in range(9)], [4, 5], temperature=0, repetition_penalty=1.5,
                       frequency_penalty=0.3) for _ in range(6)]
    cpu = [r.token_id for r in Sampler(0)(logits, greedy, set())]
    cuda = [r.token_id for r in Sampler(0, "cuda")(logits.cuda(), greedy, set())]
    assert cuda == cpu
    filtered = [make_seq([], [3], temperature=0.7, top_k=k, top_p=p, min_p=m)
                for k, p, m in [(0, 1.0, 0.0), (50, 1.0, 0.0), (0, 0.8, 0.0), (0, 1.0, 0.1), (20, 0.9, 0.05),
                                (1, 1.0, 0.0)]]
    torch.testing.assert_close(Sampler._probs(logits.cuda(), filtered).cpu(), Sampler._probs(logits, filtered),
                               atol=1e-6, rtol=1e-5)

    def seeded_draws() -> list[int]:
        seqs = [make_seq([], [3], temperature=1.0, top_p=0.95, seed=11) for _ in range(3)]
        sampler = Sampler(0, "cuda")
        return [r.token_id for _ in range(4) for r in sampler(logits[:3].cuda(), seqs, set())]

    assert seeded_draws() == seeded_draws()
