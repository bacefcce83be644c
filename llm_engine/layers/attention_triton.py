"""The GPU attention backend: Triton kernels for the KV-cache write and the paged attention.

Each step's metadata is built once on the host (slot mapping, query offsets, context lengths,
padded block tables) and copied to the device; every layer then runs two launches: the cache
write, and one attention kernel for the whole mixed batch (prefill chunks and decodes together,
split-K for long decode-only batches). On the CPU the kernels run only under the Triton
interpreter (TRITON_INTERPRET=1, set before `llm_engine.kernels` is imported), which is how the
tests check them against `TorchPagedAttention`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llm_engine.kernels import attention as attention_kernels
from llm_engine.kernels import kv_cache as kv_cache_kernels
from llm_engine.layers.attention import AttentionBackend, SeqSlice


@dataclass
class TritonAttentionMetadata:
    slot_mapping: torch.Tensor  # [tokens] int64: block * block_size + offset of each new token
    batch: attention_kernels.PagedBatch


def check_runs_on(device: torch.device | str) -> None:
    """A clear error where the kernels cannot run: on the CPU they need the interpreter."""
    if torch.device(device).type == "cpu" and not attention_kernels.INTERPRETED:
        raise ValueError("attention_backend: 'triton' runs on the CPU only under the Triton interpreter: set "
                         "TRITON_INTERPRET=1 before the engine is imported, or use 'torch' or 'native'")


class TritonPagedAttention(AttentionBackend):
    def build_metadata(self, seqs: list[SeqSlice], block_size: int,
                       device: torch.device) -> TritonAttentionMetadata:
        slots: list[int] = []
        tables: list[list[int]] = []
        for s in seqs:
            end = s.num_computed + s.num_new
            slots.extend(s.block_table[p // block_size] * block_size + p % block_size
                         for p in range(s.num_computed, end))
            tables.append(s.block_table[:-(-end // block_size)])
        batch = attention_kernels.PagedBatch.build([s.num_new for s in seqs],
                                                   [s.num_computed + s.num_new for s in seqs], tables, device)
        return TritonAttentionMetadata(torch.tensor(slots, dtype=torch.int64, device=device), batch)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, metadata: object, scale: float) -> torch.Tensor:
        assert isinstance(metadata, TritonAttentionMetadata)
        kv_cache_kernels.reshape_and_cache(k, v, k_cache, v_cache, metadata.slot_mapping)
        return attention_kernels.paged_attention(q, k_cache, v_cache, metadata.batch, scale).flatten(1)
