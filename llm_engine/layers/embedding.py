"""Vocabulary-parallel embedding and LM head (each rank holds a contiguous slice of the vocab)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llm_engine.distributed import all_gather_last_dim, all_reduce, get_tp_rank, get_tp_size
from llm_engine.layers.quantization import packed_linear, prepack


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.vocab_size = vocab_size
        self.shard_size = -(-vocab_size // self.tp_size)
        self.vocab_start = self.tp_rank * self.shard_size
        self.weight = nn.Parameter(torch.zeros(self.shard_size, hidden_size, dtype=dtype), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        shard = loaded[self.vocab_start:self.vocab_start + self.shard_size]
        param.data[:shard.shape[0]].copy_(shard)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.shard_size)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return all_reduce(out.masked_fill(outside.unsqueeze(-1), 0))


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states to logits; with tied embeddings it shares the embedding weight."""

    packed_weight: torch.Tensor | None = None

    def process_weights_after_loading(self) -> None:
        """A oneDNN-packed copy for the logits matmul where `prepack` applies (the plain weight
        stays: tied embeddings look tokens up in it)."""
        self.packed_weight = prepack(self.weight)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        local = (F.linear(hidden, self.weight) if self.packed_weight is None
                 else packed_linear(hidden, self.packed_weight, None))
        return all_gather_last_dim(local)[..., :self.vocab_size]
