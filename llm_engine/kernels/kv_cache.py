"""The KV-cache write: each new token's keys and values stored into its slot of the paged pool.

A slot is `block * block_size + offset`, the flat index of a token's place in the pool (vLLM's
slot mapping); a negative slot skips the token (padding rows of a captured CUDA graph). One program
per token copies all its kv heads: on the GPU that is one coalesced [kv_heads, head_dim] tile.

Cache layout per layer: [num_blocks, kv_heads, block_size, head_dim], last dimension contiguous.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit  # type: ignore[untyped-decorator]
def _reshape_and_cache_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,  # type: ignore[no-untyped-def]
                              stride_kt, stride_kh, stride_vt, stride_vh,
                              stride_cb, stride_ch, stride_cs,
                              block_size, num_kv_heads, head_dim,
                              BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    heads_to_write = tl.where(slot >= 0, num_kv_heads, 0)  # none for a skipped token
    mask = (heads < heads_to_write) & (dims < head_dim)
    cache_offset = (slot // block_size) * stride_cb + heads * stride_ch + (slot % block_size) * stride_cs + dims
    key = tl.load(k_ptr + token * stride_kt + heads * stride_kh + dims, mask=mask)
    tl.store(k_cache_ptr + cache_offset, key, mask=mask)
    value = tl.load(v_ptr + token * stride_vt + heads * stride_vh + dims, mask=mask)
    tl.store(v_cache_ptr + cache_offset, value, mask=mask)


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def reshape_and_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:
    """Write k, v [tokens, kv_heads, head_dim] into the caches at `slot_mapping` [tokens] (int)."""
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("reshape_and_cache: k_cache and v_cache need the same strides and contiguous rows")
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    k, v = _rows_contiguous(k), _rows_contiguous(v)
    _, _, block_size, _ = k_cache.shape
    _reshape_and_cache_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_size, num_kv_heads, head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim))


def reshape_and_cache_reference(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                slot_mapping: torch.Tensor) -> None:
    """The same write in PyTorch (what the kernel is tested against)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = k_cache.shape[2]
    k_cache[slots // block_size, :, slots % block_size] = k[keep]
    v_cache[slots // block_size, :, slots % block_size] = v[keep]
