"""Attention over the paged KV cache behind a small backend interface.

The model runner asks the backend to build its metadata once per step; each attention layer then
calls `backend.forward` with that metadata. `TorchPagedAttention` is the reference backend: it
writes the new keys/values into their slots, gathers each sequence's context from the block pool
through its block table and runs torch SDPA — decodes batched in one call, prefill chunks one
call each with a causal mask offset by the tokens already in the cache.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class SeqSlice:
    """One sequence's part of a step: tokens [computed, computed + new) and its block table."""

    num_computed: int
    num_new: int
    block_table: list[int]


@dataclass
class PrefillChunk:
    query_start: int
    query_len: int
    context_len: int  # tokens of this sequence in the cache after this step
    block_ids: torch.Tensor | None  # blocks holding the context; None if it is all in this chunk
    mask: torch.Tensor | None  # [query_len, context_len] bool, None for a plain causal prefill


@dataclass
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] where each new token's K/V is written
    block_size: int = 16
    decode_rows: torch.Tensor | None = None  # [num_decodes] token rows that are single-token decodes
    decode_blocks: torch.Tensor | None = None  # [num_decodes, max_blocks] block tables (padded)
    decode_mask: torch.Tensor | None = None  # [num_decodes, 1, 1, max_blocks * block_size] True = attend
    prefills: list[PrefillChunk] = field(default_factory=list)


class AttentionBackend(ABC):
    @abstractmethod
    def build_metadata(self, seqs: list[SeqSlice], block_size: int, device: torch.device) -> object:
        """Precompute, once per step, whatever every layer's forward needs."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, metadata: object, scale: float) -> torch.Tensor:
        """q: [tokens, heads, dim]; k, v: [tokens, kv_heads, dim]; caches: [slots, kv_heads, dim].

        Returns [tokens, heads * dim].
        """


def _slots(block_table: list[int], start: int, end: int, block_size: int) -> torch.Tensor:
    positions = torch.arange(start, end)
    table = torch.tensor(block_table, dtype=torch.long)
    return table[positions // block_size] * block_size + positions % block_size


def _decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """One query token per sequence. q: [B, heads, dim]; keys/values: [B, kv_heads, ctx, dim].

    torch's CPU SDPA is fast in float32 but several times slower in bfloat16 for this shape, so
    16-bit models use grouped matmuls with a float32 softmax instead.
    """
    if q.dtype == torch.float32:
        return F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=mask, scale=scale,
                                              enable_gqa=True).squeeze(2)
    batch, heads, dim = q.shape
    kv_heads = keys.shape[1]
    grouped = q.view(batch, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(grouped, keys.transpose(-1, -2)).float() * scale
    probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1).to(q.dtype)
    return torch.matmul(probs, values).view(batch, heads, dim)


class TorchPagedAttention(AttentionBackend):
    def build_metadata(self, seqs: list[SeqSlice], block_size: int,
                       device: torch.device) -> TorchAttentionMetadata:
        slot_parts, decode_rows, decode_tables, decode_lens = [], [], [], []
        prefills: list[PrefillChunk] = []
        row = 0
        for s in seqs:
            end = s.num_computed + s.num_new
            slot_parts.append(_slots(s.block_table, s.num_computed, end, block_size))
            num_blocks = -(-end // block_size)
            if s.num_new == 1:
                decode_rows.append(row)
                decode_tables.append(s.block_table[:num_blocks])
                decode_lens.append(end)
            elif s.num_computed == 0:
                prefills.append(PrefillChunk(row, s.num_new, end, None, None))
            else:
                q_pos = torch.arange(s.num_computed, end).unsqueeze(1)
                mask = (torch.arange(end).unsqueeze(0) <= q_pos).to(device)
                blocks = torch.tensor(s.block_table[:num_blocks], device=device)
                prefills.append(PrefillChunk(row, s.num_new, end, blocks, mask))
            row += s.num_new
        meta = TorchAttentionMetadata(slot_mapping=torch.cat(slot_parts).to(device), block_size=block_size,
                                      prefills=prefills)
        if decode_rows:
            max_blocks = max(len(t) for t in decode_tables)
            tables = torch.tensor([t + [0] * (max_blocks - len(t)) for t in decode_tables])
            lens = torch.tensor(decode_lens)
            mask = torch.arange(max_blocks * block_size).unsqueeze(0) < lens.unsqueeze(1)
            meta.decode_rows = torch.tensor(decode_rows, device=device)
            meta.decode_blocks = tables.to(device)
            meta.decode_mask = mask.view(len(decode_rows), 1, 1, -1).to(device)
        return meta

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, metadata: TorchAttentionMetadata, scale: float) -> torch.Tensor:
        k_cache.index_copy_(0, metadata.slot_mapping, k)
        v_cache.index_copy_(0, metadata.slot_mapping, v)
        out = torch.empty_like(q)
        kv_shape = k_cache.shape[1:]
        if metadata.decode_rows is not None:
            rows, blocks = metadata.decode_rows, metadata.decode_blocks
            k_blocks = k_cache.view(-1, metadata.block_size, *kv_shape)
            v_blocks = v_cache.view(-1, metadata.block_size, *kv_shape)
            keys = k_blocks[blocks].flatten(1, 2).transpose(1, 2)  # [B, kv_heads, ctx, dim]
            values = v_blocks[blocks].flatten(1, 2).transpose(1, 2)
            out[rows] = _decode_attention(q[rows], keys, values, metadata.decode_mask, scale)
        for chunk in metadata.prefills:
            rows = slice(chunk.query_start, chunk.query_start + chunk.query_len)
            if chunk.block_ids is None:  # whole context is in this chunk: no need to read the cache
                keys, values = k[rows], v[rows]
            else:
                keys = k_cache.view(-1, metadata.block_size, *kv_shape)[chunk.block_ids].flatten(0, 1)
                values = v_cache.view(-1, metadata.block_size, *kv_shape)[chunk.block_ids].flatten(0, 1)
                keys, values = keys[:chunk.context_len], values[:chunk.context_len]
            attn = F.scaled_dot_product_attention(q[rows].transpose(0, 1).contiguous(),
                                                  keys.transpose(0, 1).contiguous(),
                                                  values.transpose(0, 1).contiguous(), attn_mask=chunk.mask,
                                                  is_causal=chunk.mask is None, scale=scale,
                                                  enable_gqa=True)
            out[rows] = attn.transpose(0, 1)
        return out.flatten(1)


class Attention(nn.Module):
    """One layer's attention; the model runner binds its KV cache views after allocating the pool."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 backend: AttentionBackend) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.backend = backend
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, metadata: object) -> torch.Tensor:
        return self.backend.forward(q, k, v, self.k_cache, self.v_cache, metadata, self.scale)
