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
    context_slots: torch.Tensor  # [context_len] slot ids, oldest first
    mask: torch.Tensor | None  # [query_len, context_len] bool, None for a plain causal prefill


@dataclass
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] where each new token's K/V is written
    decode_rows: torch.Tensor | None = None  # [num_decodes] token rows that are single-token decodes
    decode_slots: torch.Tensor | None = None  # [num_decodes, max_context] slots (padded)
    decode_mask: torch.Tensor | None = None  # [num_decodes, 1, 1, max_context] True = attend
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


class TorchPagedAttention(AttentionBackend):
    def build_metadata(self, seqs: list[SeqSlice], block_size: int,
                       device: torch.device) -> TorchAttentionMetadata:
        slot_parts, decode_rows, decode_slots, decode_lens = [], [], [], []
        prefills: list[PrefillChunk] = []
        row = 0
        for s in seqs:
            end = s.num_computed + s.num_new
            slot_parts.append(_slots(s.block_table, s.num_computed, end, block_size))
            if s.num_new == 1:
                decode_rows.append(row)
                decode_slots.append(_slots(s.block_table, 0, end, block_size))
                decode_lens.append(end)
            else:
                context = _slots(s.block_table, 0, end, block_size).to(device)
                mask = None
                if s.num_computed:
                    q_pos = torch.arange(s.num_computed, end).unsqueeze(1)
                    mask = (torch.arange(end).unsqueeze(0) <= q_pos).to(device)
                prefills.append(PrefillChunk(row, s.num_new, context, mask))
            row += s.num_new
        meta = TorchAttentionMetadata(slot_mapping=torch.cat(slot_parts).to(device), prefills=prefills)
        if decode_rows:
            max_len = max(decode_lens)
            slots = torch.zeros(len(decode_rows), max_len, dtype=torch.long)
            for i, part in enumerate(decode_slots):
                slots[i, :part.numel()] = part
            lens = torch.tensor(decode_lens)
            meta.decode_rows = torch.tensor(decode_rows, device=device)
            meta.decode_slots = slots.to(device)
            meta.decode_mask = (torch.arange(max_len).unsqueeze(0) < lens.unsqueeze(1)).view(
                len(decode_rows), 1, 1, max_len).to(device)
        return meta

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, metadata: TorchAttentionMetadata, scale: float) -> torch.Tensor:
        k_cache.index_copy_(0, metadata.slot_mapping, k)
        v_cache.index_copy_(0, metadata.slot_mapping, v)
        out = torch.empty_like(q)
        if metadata.decode_rows is not None:
            rows = metadata.decode_rows
            keys = k_cache[metadata.decode_slots].transpose(1, 2)  # [B, kv_heads, ctx, dim]
            values = v_cache[metadata.decode_slots].transpose(1, 2)
            attn = F.scaled_dot_product_attention(q[rows].unsqueeze(2), keys, values,
                                                  attn_mask=metadata.decode_mask, scale=scale,
                                                  enable_gqa=True)
            out[rows] = attn.squeeze(2)
        for chunk in metadata.prefills:
            rows = slice(chunk.query_start, chunk.query_start + chunk.query_len)
            keys = k_cache[chunk.context_slots].transpose(0, 1)  # [kv_heads, ctx, dim]
            values = v_cache[chunk.context_slots].transpose(0, 1)
            attn = F.scaled_dot_product_attention(q[rows].transpose(0, 1), keys, values,
                                                  attn_mask=chunk.mask, is_causal=chunk.mask is None,
                                                  scale=scale, enable_gqa=True)
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
