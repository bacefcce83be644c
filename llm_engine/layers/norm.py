"""RMSNorm computed in float32 like the reference, with an optional fused residual add; LayerNorm
with the same residual API.

On the CPU the native kernel does the same arithmetic in one pass (torch's version is six ops,
each a pass over the tensor); on CUDA the Triton kernel does (kernels/fused.py); without a
compiler the PyTorch code runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llm_engine.kernels.switch import use_triton
from llm_engine.layers.native import cpu_kernels


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.kernels = cpu_kernels()

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without a residual: norm(x). With one: (norm(x + residual), x + residual); on the
        native and Triton paths the residual tensor is updated in place and returned."""
        if use_triton(x) and x.dtype == self.weight.dtype:
            from llm_engine.kernels import fused  # imports Triton: only when a GPU path runs

            if residual is None:
                return fused.rms_norm(x, self.weight, self.eps)
            return fused.fused_add_rms_norm(x, residual, self.weight, self.eps)
        if self.kernels is not None and self.kernels.supports(x) and x.dtype == self.weight.dtype:
            out = self.kernels.rms_norm(x, residual, self.weight, self.eps)
            return out if residual is None else (out, residual)
        if residual is None:
            return self._norm(x)
        residual = x + residual
        return self._norm(residual), residual


class LayerNorm(nn.Module):
    """torch's LayerNorm kernel behind RMSNorm's residual API: with a residual, x is added into it
    in place and (norm of the sum, the sum) returned, so a decoder's add + norm writes no new
    tensor (AutoDeploy's fuse_add_norm treats LayerNorm models as it does RMSNorm ones)."""

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype = torch.float32, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=dtype), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)
        residual.add_(x)
        return F.layer_norm(residual, self.weight.shape, self.weight, self.bias, self.eps), residual
