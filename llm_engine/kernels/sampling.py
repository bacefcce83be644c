# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Repetition, frequency and presence penalties applied to a batch of logits on the device.

The CPU sampler penalises row by row from each sequence's token list. On a GPU the logits stay
where they are: the host sends only which tokens each penalised row has produced (and, for the
repetition penalty, which its prompt holds), as flat index lists; the device counts them into
[rows, vocab] tables and one Triton kernel adjusts every row in one launch, with vLLM's semantics
(the CPU sampler's): a seen token's logit is divided by the repetition penalty when positive and
multiplied by it when not, then the frequency penalty times its count and the presence penalty
once are subtracted. `apply_penalties_reference` is the same in PyTorch, for the tests.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024


@triton.jit
def _penalties_kernel(logits_ptr, counts_ptr, prompt_ptr, repetition_ptr, frequency_ptr, presence_ptr,
                      vocab, stride_row, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < vocab
    at = row.to(tl.int64) * stride_row + cols
    logits = tl.load(logits_ptr + at, mask=ok, other=0.0)
    counts = tl.load(counts_ptr + row.to(tl.int64) * vocab + cols, mask=ok, other=0).to(tl.float32)
    in_prompt = tl.load(prompt_ptr + row.to(tl.int64) * vocab + cols, mask=ok, other=0)
    repetition = tl.load(repetition_ptr + row)
    seen = (counts > 0) | (in_prompt != 0)
    penalised = tl.where(logits > 0, logits / repetition, logits * repetition)
    logits = tl.where(seen, penalised, logits)
    logits -= tl.load(frequency_ptr + row) * counts + tl.load(presence_ptr + row) * (counts > 0).to(tl.float32)
    tl.store(logits_ptr + at, logits, mask=ok)


def penalty_tables(outputs: list[list[int]], prompts: list[list[int]], vocab: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts [rows, vocab] int32 of each row's output tokens, prompt [rows, vocab] uint8 marks
    of its prompt tokens), from two flat index transfers; ids outside the vocabulary are dropped."""
    def flat(lists: list[list[int]]) -> torch.Tensor:
        index = [row * vocab + t for row, tokens in enumerate(lists) for t in tokens if 0 <= t < vocab]
        return torch.tensor(index, dtype=torch.long).to(device, non_blocking=True)

    counts = torch.zeros(len(outputs) * vocab, dtype=torch.int32, device=device)
    outputs_index = flat(outputs)
    counts.index_add_(0, outputs_index, torch.ones_like(outputs_index, dtype=torch.int32))
    prompt = torch.zeros(len(prompts) * vocab, dtype=torch.uint8, device=device)
    prompt[flat(prompts)] = 1
    return counts.view(len(outputs), vocab), prompt.view(len(prompts), vocab)


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, prompt: torch.Tensor, repetition: torch.Tensor,
                    frequency: torch.Tensor, presence: torch.Tensor) -> None:
    """In place on float32 logits [rows, vocab] (last dim contiguous); the per-row penalties are
    float32 [rows] tensors on the logits' device."""
    rows, vocab = logits.shape
    if rows == 0:
        return
    if logits.dtype != torch.float32 or logits.stride(-1) != 1:
        raise ValueError("apply_penalties: logits must be float32 with contiguous rows")
    _penalties_kernel[(rows, triton.cdiv(vocab, _BLOCK))](
        logits, counts, prompt, repetition, frequency, presence, vocab, logits.stride(0), BLOCK=_BLOCK)


def apply_penalties_reference(logits: torch.Tensor, counts: torch.Tensor, prompt: torch.Tensor,
                              repetition: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor) -> None:
    seen = (counts > 0) | (prompt != 0)
    rep = repetition.unsqueeze(1)
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    logits.copy_(torch.where(seen, penalised, logits))
    logits -= frequency.unsqueeze(1) * counts + presence.unsqueeze(1) * (counts > 0).float()
