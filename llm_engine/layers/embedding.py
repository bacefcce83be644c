"""Vocabulary-parallel embedding and LM head (each rank holds a contiguous slice of the vocab).

Both can hold their table quantized (a GGUF file's Q8_0/Q4 token embedding, kept as is, or a
float table rounded at load when the quantization config targets it): the embedding then widens
only the rows it looks up, and the LM head multiplies with the packed table in the weight-only
kernel, through the same WeightOnlyLinearMethod as linear layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llm_engine.distributed import all_gather_last_dim, all_reduce, get_tp_rank, get_tp_size
from llm_engine.layers.quantization import WeightOnlyLinearMethod, dequantize, packed_linear, prepack


class VocabParallelEmbedding(nn.Module):
    qweight: torch.Tensor  # these two (and offsets) are made by create_weights of a quantized table
    scales: torch.Tensor

    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.vocab_size = vocab_size
        self.shard_size = -(-vocab_size // self.tp_size)
        self.vocab_start = self.tp_rank * self.shard_size
        self.input_size, self.dtype = hidden_size, dtype
        self.quant_method: WeightOnlyLinearMethod | None = None
        self.weight = nn.Parameter(torch.zeros(self.shard_size, hidden_size, dtype=dtype), requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]  # vLLM's convention: the loader rides on the parameter

    def set_quant_method(self, method: WeightOnlyLinearMethod) -> None:
        """Hold the table in `method`'s packed form instead of `weight` (before loading)."""
        del self.weight
        self.quant_method = method
        method.create_weights(self, self.input_size, self.shard_size, self.dtype)
        for param in self.parameters(recurse=False):
            param.weight_loader = self.weight_loader  # type: ignore[attr-defined]  # as in __init__

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.quant_method is None:
            return F.embedding(ids, self.weight)
        offsets = getattr(self, "offsets", None)
        rows = dequantize(self.qweight[ids.reshape(-1)], self.scales[ids.reshape(-1)],
                          None if offsets is None else offsets[ids.reshape(-1)], self.quant_method.group(self))
        return rows.to(self.dtype).view(*ids.shape, -1)

    def process_weights_after_loading(self) -> None:
        """Round a float table loaded for a quantized method (once: a tied head may ask again)."""
        if self.quant_method is not None and not hasattr(self, "qweight"):
            self.quant_method.process_weights_after_loading(self)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        if self.quant_method is not None:  # a table rounded with one scale: the whole table's
            self.quant_method.note_whole(self, loaded, param.dtype)
        shard = loaded[self.vocab_start:self.vocab_start + self.shard_size]
        param.data[:shard.shape[0]].copy_(shard)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.lookup(input_ids)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.shard_size)
        out = self.lookup(local.masked_fill(outside, 0))
        return all_reduce(out.masked_fill(outside.unsqueeze(-1), 0))


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states to logits; with tied embeddings it shares the embedding weight."""

    packed_weight: torch.Tensor | None = None
    tied_to: VocabParallelEmbedding | None = None

    def tie(self, embedding: VocabParallelEmbedding) -> None:
        """Share the (quantized) table of a tied embedding: its tensors as they are now, and
        again after loading, once the embedding has rounded a float table."""
        for name, _ in list(self.named_parameters(recurse=False)):
            delattr(self, name)
        self.__dict__["tied_to"] = embedding  # a reference, not a submodule: the decoder owns it
        method = embedding.quant_method
        self.quant_method = None if method is None else WeightOnlyLinearMethod(method.scheme, prequantized=True)
        for name, param in embedding.named_parameters(recurse=False):
            setattr(self, name, param)

    def process_weights_after_loading(self) -> None:
        """A oneDNN-packed copy for the logits matmul where `prepack` applies (it replaces an
        untied head's plain weight; a tied one stays: the embedding looks tokens up in it); a
        quantized table gets its kernel."""
        if self.tied_to is not None and self.tied_to.quant_method is not None:
            self.tied_to.process_weights_after_loading()
            self.tie(self.tied_to)
        if self.quant_method is not None:
            self.quant_method.process_weights_after_loading(self)
            return
        self.packed_weight = prepack(self.weight)
        if self.packed_weight is not None and self.tied_to is None:
            del self.weight

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.quant_method is not None:
            local = self.quant_method.apply(self, hidden, None)
        elif self.packed_weight is None:
            local = F.linear(hidden, self.weight)
        else:
            local = packed_linear(hidden, self.packed_weight, None)
        bias: torch.Tensor | None = getattr(self, "bias", None)  # a vocabulary bias (Phi's), where a subclass adds one
        if bias is not None:
            local = local + bias
        return all_gather_last_dim(local)[..., :self.vocab_size]
