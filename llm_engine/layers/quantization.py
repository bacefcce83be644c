"""Quantization hook: a QuantMethod creates a linear layer's weights and applies them.

Quantized formats (INT8/INT4/FP8/AWQ/GPTQ/GGUF kept quantized) add a QuantMethod subclass; the
layers and models stay unchanged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import nn


class QuantMethod(ABC):
    @abstractmethod
    def create_weights(self, layer: nn.Module, input_size: int, output_size: int,
                       dtype: torch.dtype) -> None:
        """Register the layer's weight parameters (per-partition sizes)."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Compute x @ W^T (+ bias) with the layer's weights."""


class UnquantizedLinearMethod(QuantMethod):
    def create_weights(self, layer: nn.Module, input_size: int, output_size: int,
                       dtype: torch.dtype) -> None:
        layer.weight = nn.Parameter(torch.empty(output_size, input_size, dtype=dtype), requires_grad=False)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)
