"""The measured dtype choice of `codeyard llm build --dtype auto`: each candidate dtype is built,
timed on this machine and scored on the calibration text, and the fastest one within the accuracy
budget is kept.

Which dtype is fastest depends on the CPU and the model, not on a rule: with AMX or AVX512-BF16
oneDNN runs bfloat16 matmuls natively (a float model's decode steps are mostly its matmuls),
while a weight-only quantized model's fused float32 kernels can lose in bfloat16. So the build
measures: decode steps of a few sequences over the built graph (the engine's own layers and
kernels, a scratch KV pool) and the perplexity of each dtype on the same calibration windows.
float32 is the reference the budget is measured from. The candidates are timed in turns once all
are built, each one's best timing kept: timed alone right after its own build, a candidate took
whatever the shared machine was doing then (at load 7 bfloat16 read 2.3 tok/s against float32's
6.3, and float32 was kept, where a quiet machine gave 76.1 against 55.9).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from llm_engine.autodeploy.sensitivity import ScratchRunner
from llm_engine.layers.attention import SeqSlice

DECODE = (4, 32, 16)  # sequences decoding together, their prompt tokens (from the calibration windows), steps timed
_TIMINGS = 2


@dataclass
class DtypeTrial:
    dtype: str
    tokens_per_s: float  # decoding DECODE[0] sequences together over the built graph
    perplexity: float  # on the calibration windows

    def line(self) -> str:
        return (f"dtype {self.dtype}: {self.tokens_per_s:.1f} tok/s decoding {DECODE[0]} sequences, "
                f"perplexity {self.perplexity:.3f}")


def candidate_dtypes(device: torch.device) -> list[str]:
    """float32, and bfloat16 where it can be faster: a GPU, or a CPU with native bf16 matmuls
    (as torch's own CPU checks report them: AVX512-BF16 or AMX tiles)."""
    native_bf16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return ["float32", "bfloat16"] if device.type != "cpu" or native_bf16 else ["float32"]


@torch.inference_mode()
def decode_rate(model: nn.Module, windows: list[list[int]], steps: int = DECODE[2]) -> float:
    """Tokens/s of `steps` greedy decode steps of the windows' sequences together, each after a
    prefill of its window; the best of two timings (the first also warms the kernels up)."""
    runner = ScratchRunner(model, max(len(w) for w in windows) + steps, len(windows))
    best = 0.0
    try:
        for _ in range(_TIMINGS):
            slices = [SeqSlice(0, len(w), table) for w, table in zip(windows, runner.tables)]
            tokens = torch.tensor([t for w in windows for t in w])
            positions = torch.cat([torch.arange(len(w)) for w in windows])
            hidden = model(tokens, positions, runner.metadata(slices))
            ends = torch.tensor([len(w) for w in windows]).cumsum(0) - 1
            tokens = model.compute_logits(hidden[ends]).argmax(-1)  # type: ignore[operator]  # AutoDeployedCausalLM
            start = time.perf_counter()
            for step in range(steps):
                slices = [SeqSlice(len(w) + step, 1, table) for w, table in zip(windows, runner.tables)]
                positions = torch.tensor([len(w) + step for w in windows])
                hidden = model(tokens, positions, runner.metadata(slices))
                tokens = model.compute_logits(hidden).argmax(-1)  # type: ignore[operator]
            best = max(best, len(windows) * steps / (time.perf_counter() - start))
    finally:
        runner.release()
    return best


def measure_dtypes(models: dict[str, nn.Module], windows: list[list[int]], rounds: int = 2) -> list[DtypeTrial]:
    """Each loaded (and quantized) candidate's trial: decode speed of DECODE[0] sequences prompted
    with the first DECODE[1] tokens of as many windows, the candidates timed in turns for `rounds`
    rounds (the best of each kept), and perplexity on all the windows."""
    prompts = [w[:DECODE[1]] for w in windows[:DECODE[0]]]
    rates = dict.fromkeys(models, 0.0)
    for _ in range(rounds):
        for dtype, model in models.items():
            rates[dtype] = max(rates[dtype], decode_rate(model, prompts))
    trials = []
    for dtype, model in models.items():
        runner = ScratchRunner(model, max(len(w) for w in windows))
        try:
            trials.append(DtypeTrial(dtype, rates[dtype], runner.perplexity(windows)))
        finally:
            runner.release()
    return trials


def choose_dtype(trials: list[DtypeTrial], budget: float) -> DtypeTrial:
    """The fastest trial whose perplexity is within `budget` (relative increase) of float32's."""
    reference = next(t for t in trials if t.dtype == "float32")
    allowed = [t for t in trials if t.perplexity <= reference.perplexity * (1 + budget)]
    return max(allowed, key=lambda t: t.tokens_per_s)
