"""The decoder layer's elementwise steps in Triton, one pass over memory each: RMSNorm with the
residual add fused in (vLLM's fused_add_rms_norm), rotary embedding applied in place to q and k
inside the fused qkv output, and SiLU(gate) * up over the fused gate_up output.

Each repeats the arithmetic of the layer's PyTorch code (layers/norm.py, rotary.py,
activation.py), the references the tests compare with: float32 inside, rounded to the
activation dtype where the PyTorch code rounds. The engine's rotary is the neox (rotate-half)
layout only, so that is the one here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _num_warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


# Kernel parameters stay unannotated: Triton reads annotations as Triton types (and ships no hints).
@triton.jit  # type: ignore[untyped-decorator]
def _rms_norm_kernel(  # type: ignore[no-untyped-def]
        x_ptr, residual_ptr, weight_ptr, out_ptr, hidden, x_stride, residual_stride, out_stride, eps,
        HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * residual_stride + cols, mask=mask, other=0.0).to(tl.float32)
        summed = (x + residual).to(residual_ptr.dtype.element_ty)
        tl.store(residual_ptr + row * residual_stride + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    normed = (x * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (normed * weight).to(out_ptr.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, hidden] without a copy when its rows are evenly strided."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x.reshape(-1, x.shape[-1])


def _rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    rows = _rows(x)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0] == 0:
        return out.view(x.shape)
    res = rows if residual is None else residual.view(-1, x.shape[-1])
    block = triton.next_power_of_2(rows.shape[1])
    _rms_norm_kernel[(rows.shape[0],)](rows, res, weight, out, rows.shape[1], rows.stride(0), res.stride(0),
                                       out.stride(0), eps, HAS_RESIDUAL=residual is not None, BLOCK=block,
                                       num_warps=_num_warps(block))
    return out.view(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * norm(x) over the last dimension, in x's dtype."""
    return _rms_norm(x, None, weight, eps)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual); the sum is written into `residual` (contiguous, x's
    shape), which is returned."""
    if not residual.is_contiguous() or residual.shape != x.shape:
        raise ValueError("residual: must be contiguous and shaped like x")
    return _rms_norm(x, residual, weight, eps), residual


@triton.jit  # type: ignore[untyped-decorator]
def _rotate_heads(  # type: ignore[no-untyped-def]
        base_ptr, token_stride, head_stride, num_heads, half, cos, sin, token,
        BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rotates one token's heads of q (or k) in place, BLOCK_H heads at a time."""
    d = tl.arange(0, BLOCK_D)
    for first in range(0, num_heads, BLOCK_H):
        heads = first + tl.arange(0, BLOCK_H)
        mask = (heads[:, None] < num_heads) & (d[None, :] < half)
        ptr = base_ptr + token * token_stride + heads[:, None] * head_stride + d[None, :]
        x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(ptr + half, mask=mask, other=0.0).to(tl.float32)
        tl.store(ptr, (x1 * cos - x2 * sin).to(base_ptr.dtype.element_ty), mask=mask)
        tl.store(ptr + half, (x2 * cos + x1 * sin).to(base_ptr.dtype.element_ty), mask=mask)


@triton.jit  # type: ignore[untyped-decorator]
def _rotary_kernel(  # type: ignore[no-untyped-def]
        positions_ptr, q_ptr, k_ptr, cos_ptr, sin_ptr, q_token_stride, q_head_stride, k_token_stride, k_head_stride,
        num_q_heads, num_k_heads, half, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    cos = tl.load(cos_ptr + position * half + d, mask=d < half, other=0.0)[None, :]
    sin = tl.load(sin_ptr + position * half + d, mask=d < half, other=0.0)[None, :]
    _rotate_heads(q_ptr, q_token_stride, q_head_stride, num_q_heads, half, cos, sin, token, BLOCK_H, BLOCK_D)
    _rotate_heads(k_ptr, k_token_stride, k_head_stride, num_k_heads, half, cos, sin, token, BLOCK_H, BLOCK_D)


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> None:
    """Rotates q [tokens, heads, head_dim] and k [tokens, kv_heads, head_dim] in place (views of the
    fused qkv output are fine: any token and head strides, head_dim contiguous), neox layout,
    token t by the float32 tables cos/sin [max_position, rotary_dim / 2] at positions[t] (the first
    rotary_dim dims of each head: all of them, or a partial rotary's part)."""
    half = cos.shape[-1]
    if q.stride(-1) != 1 or k.stride(-1) != 1 or k.shape[-1] != q.shape[-1] or 2 * half > q.shape[-1]:
        raise ValueError("rotary: q and k need the same contiguous head_dim, at least twice the tables' width")
    if q.shape[0] == 0:
        return
    block_d = triton.next_power_of_2(half)
    block_h = min(triton.next_power_of_2(max(q.shape[1], k.shape[1])), max(1, 4096 // block_d))
    _rotary_kernel[(q.shape[0],)](positions.contiguous(), q, k, cos.contiguous(), sin.contiguous(), q.stride(0),
                                  q.stride(1), k.stride(0), k.stride(1), q.shape[1], k.shape[1], half,
                                  BLOCK_H=block_h, BLOCK_D=block_d, num_warps=_num_warps(block_h * block_d))


@triton.jit  # type: ignore[untyped-decorator]
def _silu_and_mul_kernel(  # type: ignore[no-untyped-def]
        x_ptr, out_ptr, width, x_stride, out_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + width + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


SILU_BLOCK = 1024


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x = [..., gate | up], shaped [..., width]."""
    rows = _rows(x)
    width = rows.shape[1] // 2
    out = torch.empty(rows.shape[0], width, dtype=x.dtype, device=x.device)
    if rows.shape[0] and width:
        grid = (rows.shape[0], triton.cdiv(width, SILU_BLOCK))
        _silu_and_mul_kernel[grid](rows, out, width, rows.stride(0), out.stride(0), BLOCK=SILU_BLOCK)
    return out.view(*x.shape[:-1], width)
