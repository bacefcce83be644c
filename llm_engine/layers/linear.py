"""Linear layers that know how they are split across tensor-parallel ranks.

Column-parallel layers split the output features, row-parallel ones the input features (and
all-reduce the result). Each parameter carries a `weight_loader` that copies this rank's slice of
a checkpoint tensor into place, so the loaders never need to know the parallel layout.
"""

from __future__ import annotations

import torch
from torch import nn

from llm_engine.distributed import all_reduce, get_tp_rank, get_tp_size
from llm_engine.layers.quantization import QuantMethod, UnquantizedLinearMethod, WeightOnlyLinearMethod
from llm_engine.layers.row_shards import act_order_share, row_share, whole_rows


class LinearBase(nn.Module):
    prefix = "a linear layer"  # its module path once `name_layers` ran: load errors name the layer

    def __init__(self, input_size: int, output_size: int, bias: bool, dtype: torch.dtype,
                 quant_method: QuantMethod | None) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.input_size, self.output_size = input_size, output_size
        self.dtype = dtype
        self.set_quant_method(quant_method or UnquantizedLinearMethod())
        self.bias: nn.Parameter | None = None
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size, dtype=dtype), requires_grad=False)
            self.bias.weight_loader = self.weight_loader  # type: ignore[attr-defined]  # vLLM's convention: the loader rides on the parameter

    def set_quant_method(self, quant_method: QuantMethod) -> None:
        """(Re)create the weights for `quant_method` (before loading); every weight tensor it
        registers (e.g. qweight/scales) is sliced by this layer's `weight_loader`: all keep the
        output features on dim 0."""
        for name, _ in list(self.named_parameters(recurse=False)):
            if name != "bias":
                delattr(self, name)
        self.quant_method = quant_method
        quant_method.create_weights(self, self.input_size, self.output_size, self.dtype)
        for name, param in self.named_parameters(recurse=False):
            if name != "bias" and not hasattr(param, "weight_loader"):  # a method may bring its own
                param.weight_loader = self.weight_loader  # type: ignore[attr-defined]  # as for the bias

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        param.data.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


def name_layers(model: nn.Module) -> None:
    """Tell every linear layer its module path (for load errors that name it)."""
    for name, module in model.named_modules():
        if isinstance(module, LinearBase):
            module.prefix = name


class ReplicatedLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 dtype: torch.dtype = torch.float32, quant_method: QuantMethod | None = None) -> None:
        super().__init__(input_size, output_size, bias, dtype, quant_method)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; each rank keeps its slice of the output."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 dtype: torch.dtype = torch.float32, quant_method: QuantMethod | None = None) -> None:
        tp_size = get_tp_size()
        if output_size % tp_size:
            raise ValueError(f"output_size {output_size} is not divisible by tp_size {tp_size}")
        super().__init__(input_size, output_size // tp_size, bias, dtype, quant_method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        self.note_whole(param, loaded)
        size = param.shape[0]
        param.data.copy_(loaded.narrow(0, self.tp_rank * size, size))

    def note_whole(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """Let a weight rounded at load with one scale for the whole tensor see all of it (its
        method notes the absmax) before this rank keeps its rows."""
        if param is not self.bias and isinstance(self.quant_method, WeightOnlyLinearMethod):
            self.quant_method.note_whole(self, loaded, param.dtype)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections stored as one matrix (e.g. gate_proj + up_proj)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False,
                 dtype: torch.dtype = torch.float32, quant_method: QuantMethod | None = None) -> None:
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias, dtype, quant_method)

    # the loader passes the shard the checkpoint names (which projection of the fused matrix)
    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,  # type: ignore[override]
                      shard_id: int) -> None:
        self.note_whole(param, loaded)
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        size = self.output_sizes[shard_id] // self.tp_size
        shard = loaded.narrow(0, self.tp_rank * size, size)
        param.data.narrow(0, offset, size).copy_(shard)


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection; heads are split across ranks (kv heads replicated if fewer)."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False, dtype: torch.dtype = torch.float32,
                 quant_method: QuantMethod | None = None) -> None:
        tp_size = get_tp_size()
        if num_heads % tp_size or (num_kv_heads % tp_size and tp_size % num_kv_heads):
            raise ValueError(f"tensor_parallel_size: {num_heads} attention heads and {num_kv_heads} KV heads "
                             f"do not split evenly across {tp_size} ranks")
        self.head_dim = head_dim
        self.num_heads = num_heads // tp_size
        self.num_kv_heads = max(1, num_kv_heads // tp_size)
        self.kv_replicas = max(1, tp_size // num_kv_heads)
        output_size = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp_size
        super().__init__(hidden_size, output_size, bias, dtype, quant_method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,  # type: ignore[override]  # as above
                      shard_id: str) -> None:
        self.note_whole(param, loaded)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        offset, size, rank = {"q": (0, q_size, self.tp_rank),
                              "k": (q_size, kv_size, self.tp_rank // self.kv_replicas),
                              "v": (q_size + kv_size, kv_size, self.tp_rank // self.kv_replicas)}[shard_id]
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, rank * size, size))


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial results are summed with an all-reduce."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 dtype: torch.dtype = torch.float32, quant_method: QuantMethod | None = None) -> None:
        tp_size = get_tp_size()
        if input_size % tp_size:
            raise ValueError(f"input_size {input_size} is not divisible by tp_size {tp_size}")
        super().__init__(input_size // tp_size, output_size, bias, dtype, quant_method)

    def set_quant_method(self, quant_method: QuantMethod) -> None:
        """As LinearBase's; at more than one rank every tensor loads through this layer's loader, an
        act-order layer's input order too (it decides which columns the rank keeps)."""
        super().set_quant_method(quant_method)
        self.pending: dict[str, torch.Tensor] = {}
        if self.tp_size > 1:
            for name, param in self.named_parameters(recurse=False):
                if name != "bias":
                    param.weight_loader = self.weight_loader  # type: ignore[attr-defined]  # as in LinearBase

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        if param is self.bias or self.tp_size == 1:  # a bias is added once, after the reduction
            param.data.copy_(loaded)
            return
        name = next(key for key, value in self.named_parameters(recurse=False) if value is param)
        method = self.quant_method
        if isinstance(method, WeightOnlyLinearMethod) and not method.prequantized and whole_rows(self):
            self.round_whole(loaded)
            return
        if not (isinstance(method, WeightOnlyLinearMethod) and method.act_order):
            share = row_share(self, name, loaded)
            if share.shape != param.shape:
                raise ValueError(f"tensor_parallel_size: {self.prefix}.{name}: the rank's share {tuple(share.shape)} "
                                 f"of {tuple(loaded.shape)} does not fit the layer's {tuple(param.shape)}")
            param.data.copy_(share)
            return
        self.pending[name] = loaded  # the share needs the codes, scales and input order together
        if set(self.pending) == {key for key, _ in self.named_parameters(recurse=False)} - {"bias"}:
            for key, value in act_order_share(self, self.pending).items():
                getattr(self, key).data = value
            self.pending = {}

    def round_whole(self, weight: torch.Tensor) -> None:
        """Round the whole layer's float weight as one rank would, then keep this rank's share of
        it: a row's one scale (per channel or per tensor) is then the row's, not the share's."""
        method = self.quant_method
        assert isinstance(method, WeightOnlyLinearMethod)
        whole = ReplicatedLinear(weight.shape[1], weight.shape[0], dtype=weight.dtype,
                                 quant_method=WeightOnlyLinearMethod(method.scheme))
        whole.weight.data = weight
        whole.quant_method.process_weights_after_loading(whole)
        self.set_quant_method(WeightOnlyLinearMethod(method.scheme, prequantized=True))
        for name, param in self.named_parameters(recurse=False):
            if name != "bias":
                param.data.copy_(row_share(self, name, getattr(whole, name)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if self.tp_rank == 0 else None
        method = self.quant_method
        if self.tp_size > 1 and isinstance(method, WeightOnlyLinearMethod) and method.scheme.scales_tokens:
            # one scale a token, as at one rank: the largest absmax of every rank's share of it
            row_absmax = all_reduce(x.reshape(-1, x.shape[-1]).abs().amax(-1).float(), "max")
            return all_reduce(method.apply(self, x, bias, row_absmax))
        return all_reduce(method.apply(self, x, bias))
