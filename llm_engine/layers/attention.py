"""Attention over the paged KV cache behind a small backend interface.

The model runner asks the backend to build its metadata once per step; each attention layer then
calls `backend.forward` with that metadata. `TorchPagedAttention` is the reference backend: it
writes the new keys/values into their slots, gathers each sequence's blocks from the pool through
its block table (index_select on whole blocks, the cheapest gather on CPU), and computes decodes
for the whole batch with grouped matmuls over the blocks, and prefill chunks with torch SDPA (one
call each, causal mask offset by the tokens already in the cache).

Cache layout per layer: [num_blocks, kv_heads, block_size, head_dim].
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
    slot_blocks: torch.Tensor  # [num_tokens] block where each new token's K/V is written
    slot_offsets: torch.Tensor  # [num_tokens] position inside that block
    decode_rows: torch.Tensor | None = None  # [num_decodes] token rows that are single-token decodes
    decode_blocks: torch.Tensor | None = None  # [num_decodes * max_blocks] block tables, padded, flat
    decode_mask: torch.Tensor | None = None  # [num_decodes, max_blocks * block_size] True = attend
    prefills: list[PrefillChunk] = field(default_factory=list)


class AttentionBackend(ABC):
    @abstractmethod
    def build_metadata(self, seqs: list[SeqSlice], block_size: int, device: torch.device) -> object:
        """Precompute, once per step, whatever every layer's forward needs."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, metadata: object, scale: float) -> torch.Tensor:
        """q: [tokens, heads, dim]; k, v: [tokens, kv_heads, dim];
        caches: [num_blocks, kv_heads, block_size, dim]. Returns [tokens, heads * dim]."""


def _decode_attention(q: torch.Tensor, key_blocks: torch.Tensor, value_blocks: torch.Tensor,
                      mask: torch.Tensor, scale: float) -> torch.Tensor:
    """One query token per sequence, straight from gathered blocks (no per-sequence copy).

    q: [B, heads, dim]; key/value_blocks: [B, blocks, kv_heads, block_size, dim];
    mask: [B, blocks * block_size] True where a key is part of the sequence.
    """
    batch, heads, dim = q.shape
    _, num_blocks, kv_heads, block_size, _ = key_blocks.shape
    group = heads // kv_heads
    grouped = q.view(batch, 1, kv_heads, group, dim)
    scores = torch.matmul(grouped, key_blocks.transpose(-1, -2)).float() * scale  # [B, n, kvh, g, bs]
    scores = scores.permute(0, 2, 3, 1, 4).reshape(batch, kv_heads, group, num_blocks * block_size)
    probs = scores.masked_fill(~mask.view(batch, 1, 1, -1), float("-inf")).softmax(dim=-1).to(q.dtype)
    probs = probs.view(batch, kv_heads, group, num_blocks, block_size).permute(0, 3, 1, 2, 4)
    return torch.matmul(probs, value_blocks).sum(dim=1).view(batch, heads, dim)


def _slots(block_table: list[int], start: int, end: int, block_size: int) -> torch.Tensor:
    """Flat slot ids (block * block_size + offset) of positions [start, end)."""
    positions = torch.arange(start, end)
    table = torch.tensor(block_table, dtype=torch.long)
    return table[positions // block_size] * block_size + positions % block_size


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
        slots = torch.cat(slot_parts)
        meta = TorchAttentionMetadata(slot_blocks=(slots // block_size).to(device),
                                      slot_offsets=(slots % block_size).to(device), prefills=prefills)
        if decode_rows:
            max_blocks = max(len(t) for t in decode_tables)
            tables = torch.tensor([t + [0] * (max_blocks - len(t)) for t in decode_tables])
            lens = torch.tensor(decode_lens)
            meta.decode_rows = torch.tensor(decode_rows, device=device)
            meta.decode_blocks = tables.flatten().to(device)
            meta.decode_mask = (torch.arange(max_blocks * block_size).unsqueeze(0) < lens.unsqueeze(1)).to(device)
        return meta

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, metadata: TorchAttentionMetadata, scale: float) -> torch.Tensor:
        k_cache[metadata.slot_blocks, :, metadata.slot_offsets] = k
        v_cache[metadata.slot_blocks, :, metadata.slot_offsets] = v
        out = torch.empty_like(q)
        if metadata.decode_rows is not None:
            rows = metadata.decode_rows
            shape = (rows.numel(), -1, *k_cache.shape[1:])
            key_blocks = k_cache.index_select(0, metadata.decode_blocks).view(shape)
            value_blocks = v_cache.index_select(0, metadata.decode_blocks).view(shape)
            out[rows] = _decode_attention(q[rows], key_blocks, value_blocks, metadata.decode_mask, scale)
        for chunk in metadata.prefills:
            rows = slice(chunk.query_start, chunk.query_start + chunk.query_len)
            if chunk.block_ids is None:  # the whole context is in this chunk: no need to read the cache
                keys, values = k[rows].transpose(0, 1), v[rows].transpose(0, 1)
            else:  # [blocks, kv_heads, block_size, dim] -> [kv_heads, context, dim]
                keys = k_cache.index_select(0, chunk.block_ids).transpose(0, 1).flatten(1, 2)
                values = v_cache.index_select(0, chunk.block_ids).transpose(0, 1).flatten(1, 2)
                keys, values = keys[:, :chunk.context_len], values[:, :chunk.context_len]
            attn = F.scaled_dot_product_attention(q[rows].transpose(0, 1).contiguous(), keys.contiguous(),
                                                  values.contiguous(), attn_mask=chunk.mask,
                                                  is_causal=chunk.mask is None, scale=scale, enable_gqa=True)
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
