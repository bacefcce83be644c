"""Attention over the paged KV cache behind a small backend interface.

The model runner asks the backend to build its metadata once per step; each attention layer then
calls `backend.forward` with that metadata. `TorchPagedAttention` is the reference backend: it
writes the new keys/values into their slots, gathers each sequence's blocks from the pool through
its block table (index_select on whole blocks, the cheapest gather on CPU), and computes decodes
for the whole batch with grouped matmuls over the blocks, and prefill chunks with torch SDPA (one
call each, causal mask offset by the tokens already in the cache; whole prompts of one length that
follow each other in the step share one batched call, `prefill_runs`: a batch of short prompts
was ~30% SDPA set-up per prompt, and a prompt's result does not depend on its batch). `NativePagedAttention`, the
CPU default, replaces only the decode part with a C++ kernel that reads the pool in place: the
per-layer gather of every block of every sequence was most of a decode step's time.

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
    """One sequence's part of a step: tokens [computed, computed + new) and its block table.
    `as_decodes`: each new token attends as a one-token step of its own would (a speculative
    draft's verification): the decode kernel then gives every row that step's bits in any dtype,
    so greedy speculation returns exactly what decoding without it does (a causal SDPA over the
    chunk rounds differently in bfloat16)."""

    num_computed: int
    num_new: int
    block_table: list[int]
    as_decodes: bool = False


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
    decode_rows: slice | torch.Tensor | None = None  # token rows that are single-token decodes
    decode_tables: torch.Tensor | None = None  # [num_decodes, max_blocks] int32 block tables, padded
    decode_lens: torch.Tensor | None = None  # [num_decodes] int32 context length of each decode
    decode_blocks: torch.Tensor | None = None  # decode_tables flattened (long), for index_select
    decode_mask: torch.Tensor | None = None  # [num_decodes, max_blocks * block_size] True = attend
    prefills: list[PrefillChunk] = field(default_factory=list)
    _runs: list[list[PrefillChunk]] | None = field(default=None, init=False, repr=False)

    def prefill_runs(self) -> list[list[PrefillChunk]]:
        """`prefills` in order, whole prompts of one length in adjacent rows grouped (one SDPA call
        each group): computed once per step, on the first layer's call."""
        if self._runs is None:
            self._runs = []
            for chunk in self.prefills:
                last = self._runs[-1][-1] if self._runs else None
                if (last is not None and chunk.block_ids is None and last.block_ids is None
                        and chunk.query_len == last.query_len and last.query_start + last.query_len == chunk.query_start):
                    self._runs[-1].append(chunk)
                else:
                    self._runs.append([chunk])
        return self._runs


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


class TorchPagedAttention(AttentionBackend):
    def build_metadata(self, seqs: list[SeqSlice], block_size: int,
                       device: torch.device) -> TorchAttentionMetadata:
        slot_blocks, slot_offsets, decode_rows, decode_tables, decode_lens = [], [], [], [], []
        prefills: list[PrefillChunk] = []
        row = 0
        for s in seqs:
            end = s.num_computed + s.num_new
            for position in range(s.num_computed, end):  # where each new token's K/V goes
                slot_blocks.append(s.block_table[position // block_size])
                slot_offsets.append(position % block_size)
            num_blocks = -(-end // block_size)
            if s.num_new == 1 or s.as_decodes:
                for length in range(s.num_computed + 1, end + 1):
                    decode_rows.append(row + length - s.num_computed - 1)
                    decode_tables.append(s.block_table[:-(-length // block_size)])
                    decode_lens.append(length)
            elif s.num_computed == 0:
                prefills.append(PrefillChunk(row, s.num_new, end, None, None))
            else:
                q_pos = torch.arange(s.num_computed, end).unsqueeze(1)
                mask = (torch.arange(end).unsqueeze(0) <= q_pos).to(device)
                blocks = torch.tensor(s.block_table[:num_blocks], device=device)
                prefills.append(PrefillChunk(row, s.num_new, end, blocks, mask))
            row += s.num_new
        meta = TorchAttentionMetadata(slot_blocks=torch.tensor(slot_blocks, device=device),
                                      slot_offsets=torch.tensor(slot_offsets, device=device), prefills=prefills)
        if decode_rows:
            max_blocks = max(len(t) for t in decode_tables)
            tables = torch.tensor([t + [0] * (max_blocks - len(t)) for t in decode_tables], dtype=torch.int32)
            lens = torch.tensor(decode_lens, dtype=torch.int32)
            contiguous = decode_rows[-1] - decode_rows[0] + 1 == len(decode_rows)
            meta.decode_rows = (slice(decode_rows[0], decode_rows[-1] + 1) if contiguous
                                else torch.tensor(decode_rows, device=device))
            meta.decode_tables, meta.decode_lens = tables.to(device), lens.to(device)
            self._add_decode_gather(meta, block_size)
        return meta

    @staticmethod
    def _add_decode_gather(meta: TorchAttentionMetadata, block_size: int) -> None:
        """The flat block list and key mask the reference decode gathers with (once per step)."""
        tables, lens = meta.decode_tables, meta.decode_lens
        assert tables is not None and lens is not None  # set with decode_rows
        meta.decode_blocks = tables.flatten().long()
        positions = torch.arange(tables.shape[1] * block_size, device=tables.device)
        meta.decode_mask = positions.unsqueeze(0) < lens.unsqueeze(1)

    def write_cache(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    metadata: TorchAttentionMetadata) -> None:
        """Store the step's new keys and values in their slots."""
        k_cache[metadata.slot_blocks, :, metadata.slot_offsets] = k
        v_cache[metadata.slot_blocks, :, metadata.slot_offsets] = v

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, metadata: object, scale: float) -> torch.Tensor:
        assert isinstance(metadata, TorchAttentionMetadata)
        self.write_cache(k, v, k_cache, v_cache, metadata)
        if isinstance(metadata.decode_rows, slice) and metadata.decode_rows == slice(0, q.shape[0]):
            return self.decode(q, k_cache, v_cache, metadata, scale).flatten(1)
        out = torch.empty_like(q)
        if metadata.decode_rows is not None:
            rows = metadata.decode_rows
            out[rows] = self.decode(q[rows], k_cache, v_cache, metadata, scale)
        for run in metadata.prefill_runs():
            chunk = run[0]
            if len(run) > 1:  # whole prompts of one length: [prompts, heads, length, dim], one causal call
                self._whole_prompts(q, k, v, out, chunk.query_start, len(run), chunk.query_len, scale)
                continue
            rows = slice(chunk.query_start, chunk.query_start + chunk.query_len)
            if chunk.block_ids is None:  # the whole context is in this chunk: no need to read the cache
                keys, values = k[rows].transpose(0, 1), v[rows].transpose(0, 1)
            else:  # [blocks, kv_heads, block_size, dim] -> [kv_heads, context, dim]
                keys = k_cache.index_select(0, chunk.block_ids).transpose(0, 1).flatten(1, 2)
                values = v_cache.index_select(0, chunk.block_ids).transpose(0, 1).flatten(1, 2)
                keys, values = keys[:, :chunk.context_len], values[:, :chunk.context_len]
            # 4-D inputs: with 3-D ones torch takes its slow "math" path on the CPU (5x slower).
            attn = F.scaled_dot_product_attention(q[rows].transpose(0, 1).unsqueeze(0), keys.unsqueeze(0),
                                                  values.unsqueeze(0), attn_mask=chunk.mask,
                                                  is_causal=chunk.mask is None, scale=scale, enable_gqa=True)
            out[rows] = attn[0].transpose(0, 1)
        return out.flatten(1)

    @staticmethod
    def _whole_prompts(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, start: int,
                       count: int, length: int, scale: float) -> None:
        """Causal attention of `count` whole prompts of `length` tokens in rows start.. of q/k/v."""
        rows = slice(start, start + count * length)

        def batched(t: torch.Tensor) -> torch.Tensor:  # [count * length, heads, dim] -> [count, heads, length, dim]
            return t[rows].view(count, length, *t.shape[1:]).transpose(1, 2)

        attn = F.scaled_dot_product_attention(batched(q), batched(k), batched(v), is_causal=True, scale=scale,
                                              enable_gqa=True)
        out[rows] = attn.transpose(1, 2).flatten(0, 1)

    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               metadata: TorchAttentionMetadata, scale: float) -> torch.Tensor:
        """Attention of one query token per decoding sequence: q [decodes, heads, dim]."""
        assert metadata.decode_blocks is not None and metadata.decode_mask is not None
        shape = (q.shape[0], -1, *k_cache.shape[1:])
        key_blocks = k_cache.index_select(0, metadata.decode_blocks).view(shape)
        value_blocks = v_cache.index_select(0, metadata.decode_blocks).view(shape)
        return _decode_attention(q, key_blocks, value_blocks, metadata.decode_mask, scale)


class NativePagedAttention(TorchPagedAttention):
    """The CPU fast path: decodes run a C++ kernel that reads keys and values straight from the
    pool through the block tables (no per-layer gathered copy), and another writes the new keys
    and values (two index_puts in the reference); prefill chunks and dtypes the kernels lack
    (float16) go through the reference code."""

    def __init__(self) -> None:
        from llm_engine.layers.native import load_kernels

        kernels = load_kernels()
        self._kernels = {torch.float32: kernels.paged_decode_f32, torch.bfloat16: kernels.paged_decode_bf16}
        self._writers = {torch.float32: kernels.write_kv_f32, torch.bfloat16: kernels.write_kv_bf16}

    def write_cache(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    metadata: TorchAttentionMetadata) -> None:
        writer = self._writers.get(k.dtype)
        rows_contiguous = all(t.stride(-1) == 1 and t.stride(-2) == t.shape[-1] for t in (k, v))
        if writer is None or k.device.type != "cpu" or not rows_contiguous:
            return super().write_cache(k, v, k_cache, v_cache, metadata)
        _, kv_heads, block_size, dim = k_cache.shape
        writer(k.data_ptr(), v.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), metadata.slot_blocks.data_ptr(),
               metadata.slot_offsets.data_ptr(), k.shape[0], kv_heads, block_size, dim, k.stride(0), v.stride(0))

    @staticmethod
    def _add_decode_gather(meta: TorchAttentionMetadata, block_size: int) -> None:
        pass  # the kernel reads the block tables itself; computed lazily if the reference path runs

    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               metadata: TorchAttentionMetadata, scale: float) -> torch.Tensor:
        kernel = self._kernels.get(q.dtype)
        if kernel is None or q.device.type != "cpu":
            if metadata.decode_blocks is None:
                TorchPagedAttention._add_decode_gather(metadata, k_cache.shape[2])
            return super().decode(q, k_cache, v_cache, metadata, scale)
        q = q.contiguous()
        out = torch.empty_like(q)
        tables, lens = metadata.decode_tables, metadata.decode_lens
        assert tables is not None and lens is not None
        _, kv_heads, block_size, dim = k_cache.shape
        kernel(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
               lens.data_ptr(), out.data_ptr(), q.shape[0], q.shape[1], kv_heads,
               block_size, dim, tables.shape[1], scale)
        return out


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
