"""Rotary position embedding (neox / rotate-half layout, as in Hugging Face Llama/Qwen).

The tables' width sets how much of each head is rotated: head_dim / 2 rotates all of it, less
rotates the first 2 * width dims and leaves the rest (partial rotary: GPT-NeoX, StableLM, Phi).

On the CPU the native kernel rotates q and k in place (in the fused qkv output) with the same
float32 arithmetic, on CUDA the Triton kernel does (kernels/fused.py); without a compiler the
PyTorch code runs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from llm_engine.kernels.switch import use_triton
from llm_engine.layers.native import cpu_kernels


def _inv_freq(head_dim: int, rope: dict[str, Any]) -> torch.Tensor:
    theta = float(rope.get("rope_theta", 10000.0))
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(rope["factor"])
    if rope_type == "llama3":
        factor, low, high = float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
        old_len = float(rope["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"rope_scaling: rope_type {rope_type!r} is not supported")


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, rope: dict[str, Any]) -> None:
        super().__init__()
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), _inv_freq(head_dim, rope))
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)
        self.kernels = cpu_kernels()

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rotated = 2 * cos.shape[-1]
        x1, x2 = x[..., :rotated].float().chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
        return out if rotated == x.shape[-1] else torch.cat((out, x[..., rotated:]), dim=-1)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [tokens, heads, head_dim], k: [tokens, kv_heads, head_dim]."""
        if use_triton(q):
            from llm_engine.kernels.fused import rotary_embedding  # imports Triton: only when a GPU path runs

            rotary_embedding(positions, q, k, self.cos, self.sin)
            return q, k
        if self.kernels is not None and self.kernels.supports(q):
            self.kernels.rotary(positions, q, k, self.cos, self.sin)
            return q, k
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)
