"""Gated activation for SwiGLU MLPs: silu(gate) * up over a fused gate_up tensor (one native
pass on the CPU, one Triton pass on CUDA, torch ops otherwise)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llm_engine.kernels.switch import use_triton
from llm_engine.layers.native import cpu_kernels


class SiluAndMul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernels = cpu_kernels()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_triton(x):
            from llm_engine.kernels.fused import silu_and_mul  # imports Triton: only when a GPU path runs

            return silu_and_mul(x)
        if self.kernels is not None and self.kernels.supports(x):
            return self.kernels.silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
