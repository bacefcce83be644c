"""AWQ's activation-aware scaling (Lin et al., 2023), for `codeyard llm quantize --method awq`.

Inputs that carry large activations matter more, so before rounding, a layer's input column k is
multiplied by s_k = a_k^alpha (a_k: the input's root mean square on calibration text) and the
operation that produces the input divides by s_k (the RMSNorm weight, or the rows of up_proj
for down_proj): the float model is unchanged, its important columns get finer steps. alpha is
searched on a grid, each candidate scored by the output error the rounding causes on the
calibration inputs, tr(D H D^T) with D the weight error and H = X^T X (no forward passes needed).
AutoAWQ's weight-clipping search is not done.
"""

from __future__ import annotations

import torch

from llm_engine.layers.quantization_formats import quantize_rtn

GRID = 20  # alpha in 0, 1/20, ..., 1


def rtn_dequantized(w: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """w [N, K] after round-to-nearest with zero points (AWQ's form) and back, float32."""
    codes, zeros, scales = quantize_rtn(w, bits, group, symmetric=False)
    g_idx = torch.arange(w.shape[1]) // group
    return ((codes - zeros[g_idx]) * scales.float()[g_idx]).t()


def output_error(w: torch.Tensor, approx: torch.Tensor, moments: torch.Tensor) -> float:
    d = w.float() - approx
    return float(((d @ moments.float()) * d).sum())


def search_scales(weights: list[torch.Tensor], moments: torch.Tensor, bits: int, group: int | None) -> torch.Tensor:
    """Per-input scales s [K] for the projections that read one input (each [N_i, K]): the alpha
    whose rounding moves their outputs least (alpha = 0, all ones, is plain rounding)."""
    w = torch.cat([x.float() for x in weights])
    group = group or w.shape[1]
    rms = moments.diagonal().float().clamp(min=0).sqrt()
    best_error, best = output_error(w, rtn_dequantized(w, bits, group), moments), torch.ones_like(rms)
    for step in range(1, GRID + 1):
        s = rms.pow(step / GRID).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        error = output_error(w, rtn_dequantized(w * s, bits, group) / s, moments)
        if error < best_error:
            best_error, best = error, s
    return best
