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

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Turn loaded weights into the form `apply` runs fastest with (once, after loading)."""


def prepack(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's prepacked copy of a bfloat16 CPU weight, or None. Its linear gives the same bits
    as F.linear, faster (up to 2x for the few-row matmuls of decode steps); float32 stays on
    F.linear, whose results it would change."""
    if weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and onednn_bf16_available():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach())
    return None


def onednn_bf16_available() -> bool:
    """oneDNN's bf16 linear needs AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT on x86."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class UnquantizedLinearMethod(QuantMethod):
    def create_weights(self, layer: nn.Module, input_size: int, output_size: int,
                       dtype: torch.dtype) -> None:
        layer.weight = nn.Parameter(torch.empty(output_size, input_size, dtype=dtype), requires_grad=False)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        packed = prepack(layer.weight)
        if packed is not None:  # replaces the plain weight: no second copy
            layer.packed_weight = packed
            del layer.weight

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        packed = getattr(layer, "packed_weight", None)
        if packed is not None:
            return packed_linear(x, packed, bias)
        return F.linear(x, layer.weight, bias)
