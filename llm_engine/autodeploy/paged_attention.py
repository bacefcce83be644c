"""The engine's paged attention in the layout of a captured Transformers graph.

Plain causal attention (any GQA/MQA grouping) goes to the engine's `Attention` and its backend
unchanged. Sliding windows and logit soft-capping (Gemma 2, Mistral-style windows) are not in
the backends' kernels yet: those layers write the KV pool through the backend and attend with
explicit scores over each sequence's gathered blocks (the CPU backends' metadata only).
"""

from __future__ import annotations

import torch
from torch import nn

from llm_engine.layers.attention import Attention, AttentionBackend, TorchAttentionMetadata, TorchPagedAttention


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, sliding_window: int,
                 softcap: float, backend: AttentionBackend) -> None:
        super().__init__()
        self.attn = Attention(num_heads, num_kv_heads, head_dim, scale, backend)
        self.sliding_window, self.softcap = sliding_window, softcap
        self.tokens_first = False  # inputs [1, T, heads, dim] (as projected) instead of [1, heads, T, dim]
        self.batch_dim = True  # False (tokens first only): inputs [T, heads, dim], output [T, heads * dim]
        self.check_backend(backend)

    def check_backend(self, backend: AttentionBackend) -> None:
        """Windowed and soft-capped layers read the pool in the CPU backends' layout."""
        if (self.sliding_window or self.softcap) and not isinstance(backend, TorchPagedAttention):
            raise ValueError(f"autodeploy: sliding window / soft-capped attention needs the 'torch' or 'native' "
                             f"attention backend, not {type(backend).__name__}")

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, metadata: object) -> torch.Tensor:
        """q [1, heads, T, dim], k/v [1, kv_heads, T, dim] (tokens first: [1, T, heads, dim]) ->
        [1, T, heads, dim]; without the batch dimension [T, heads, dim] -> [T, heads * dim], as the
        engine's attention returns it for the output projection."""
        if self.batch_dim:
            q, k, v = (x[0] if self.tokens_first else x[0].transpose(0, 1) for x in (q, k, v))
        tokens, heads, dim = q.shape
        # as the hand-written layers pass them: q and k may be views of the fused qkv output
        q, k, v = _rows(q), _rows(k), v.contiguous()
        if self.sliding_window or self.softcap:
            out = self._masked(q, k.contiguous(), v, metadata).flatten(1)
        else:
            out = self.attn(q, k, v, metadata)
        return out.view(1, tokens, heads, dim) if self.batch_dim else out

    def _masked(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, metadata: object) -> torch.Tensor:
        assert isinstance(metadata, TorchAttentionMetadata) and isinstance(self.attn.backend, TorchPagedAttention)
        k_cache, v_cache = self.attn.k_cache, self.attn.v_cache
        self.attn.backend.write_cache(k, v, k_cache, v_cache, metadata)
        out = torch.empty_like(q)
        if metadata.decode_rows is not None:
            assert metadata.decode_tables is not None and metadata.decode_lens is not None
            rows = torch.arange(q.shape[0])[metadata.decode_rows]
            for row, table, length in zip(rows.tolist(), metadata.decode_tables, metadata.decode_lens.tolist()):
                keys, values = _gather(k_cache, table, length), _gather(v_cache, table, length)
                out[row:row + 1] = self._attend(q[row:row + 1], keys, values, torch.tensor([length - 1]))
        for chunk in metadata.prefills:
            rows_slice = slice(chunk.query_start, chunk.query_start + chunk.query_len)
            if chunk.block_ids is None:
                keys, values = k[rows_slice].transpose(0, 1), v[rows_slice].transpose(0, 1)
            else:
                keys = _gather(k_cache, chunk.block_ids, chunk.context_len)
                values = _gather(v_cache, chunk.block_ids, chunk.context_len)
            first = chunk.context_len - chunk.query_len
            out[rows_slice] = self._attend(q[rows_slice], keys, values, torch.arange(first, chunk.context_len))
        return out

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                q_positions: torch.Tensor) -> torch.Tensor:
        """q [n, heads, dim] at `q_positions`; keys/values [kv_heads, context, dim] from position 0."""
        group = q.shape[1] // keys.shape[0]
        keys, values = keys.repeat_interleave(group, dim=0), values.repeat_interleave(group, dim=0)
        scores = torch.matmul(q.transpose(0, 1), keys.transpose(-1, -2)).float() * self.attn.scale
        if self.softcap:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        k_positions = torch.arange(keys.shape[1])
        allowed = k_positions[None, :] <= q_positions[:, None]
        if self.sliding_window:
            allowed &= k_positions[None, :] > q_positions[:, None] - self.sliding_window
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1).to(values.dtype)
        return torch.matmul(probs, values).transpose(0, 1)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [tokens, heads, dim] with each token's heads contiguous (a view of a fused projection's
    output already is; a copy otherwise)."""
    return x if x.stride(-1) == 1 and x.stride(-2) == x.shape[-1] else x.contiguous()


def _gather(cache: torch.Tensor, blocks: torch.Tensor, length: int) -> torch.Tensor:
    """[kv_heads, length, dim] of one sequence from its blocks of the pool."""
    gathered = cache.index_select(0, blocks.long()).transpose(0, 1).flatten(1, 2)
    return gathered[:, :length]
