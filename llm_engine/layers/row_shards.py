"""A row-parallel layer's share of a quantized weight (a pre-quantized checkpoint's, or a built
engine's saved one-rank layer).

Every quantized tensor (codes, scales, zero points) keeps the output features on dim 0, so
column-parallel layers cut rows as for float weights. A row-parallel layer cuts the inputs: its
rank takes the codes of its columns and the scales and zero points of its groups, which is exact
only when no group straddles two ranks. Either each rank's share is a whole number of groups, or
the row is one group (int8 per output channel, fp8 per channel or per tensor, a group wider than
the row), whose scale and zero point every rank keeps. Anything else (int4 g128 over 192 inputs
at two ranks: 96 each) is refused naming the layer: no split of a group's scale is right for both
halves. int4 codes are packed two to a byte within each group (pack_int4: element j and j + len/2),
so they are unpacked, cut and packed again for the rank's grouping; cutting the bytes is right
only for whole groups.

Act-order (GPTQ desc_act) weights come with each group's inputs made contiguous in a permuted
order, so a rank's columns are scattered over every group: `act_order_share` takes, group by
group, the rank's columns in that order, pads each run to whole sub-groups of ACT_ORDER_SUB_GROUP
(their codes multiply an appended zero activation) and gives each sub-group its group's scale and
zero point. Every weight keeps its codes, scale and zero point, so the rank's partial product is
the one-rank product's share (vLLM keeps each rank's g_idx and lets its kernels look groups up per
input; ours take fixed groups, hence the padding).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from llm_engine.layers.quantization import WeightOnlyLinearMethod, group_count, pack_int4, unpack_int4

if TYPE_CHECKING:
    from llm_engine.layers.linear import RowParallelLinear

# Inputs per scale in a rank's share of an act-order layer: the kernel's 32-input groups; a group
# of 128 split ~64/64 between two ranks pads ~16 inputs per group and rank (~25% more codes).
ACT_ORDER_SUB_GROUP = 32


def row_share(layer: RowParallelLinear, name: str, loaded: torch.Tensor) -> torch.Tensor:
    """`layer`'s share of the whole layer's tensor `name` (a float or quantized weight)."""
    method, share, rank = layer.quant_method, layer.input_size, layer.tp_rank
    if not isinstance(method, WeightOnlyLinearMethod) or not method.prequantized or name == "weight":
        return _columns(layer, name, loaded, rank * share, share)  # float: each rank rounds its share of whole groups
    group, whole_row = method.scheme.group_size or share * layer.tp_size, whole_rows(layer)
    if not whole_row and share % group:
        raise ValueError(f"tensor_parallel_size: {layer.prefix} is quantized {method.scheme.describe()}: its "
                         f"{share * layer.tp_size} inputs across {layer.tp_size} ranks are {share} each, not whole "
                         f"groups of {group}; use a group size that divides {share}, or a tensor_parallel_size whose "
                         f"share of every layer's inputs is whole groups")
    if name in ("scales", "offsets"):
        return loaded if whole_row else _columns(layer, name, loaded, rank * share // group, share // group)
    if name != "qweight":
        raise ValueError(f"tensor_parallel_size: {layer.prefix}.{name}: a quantized tensor with no known split "
                         f"across ranks")
    if method.scheme.weights != "int4":
        return _columns(layer, name, loaded, rank * share, share)
    codes = unpack_int4(loaded, group)
    return pack_int4(_columns(layer, name, codes, rank * share, share).contiguous(), method.group(layer))


def whole_rows(layer: RowParallelLinear) -> bool:
    """Whether each row of `layer`'s quantized weight is one group (int8/fp8 per channel, fp8 per
    tensor, a group as wide as the row): every rank keeps the row's scale and zero point. A float
    weight is then rounded whole before it is cut (RowParallelLinear.round_whole), or each rank's
    scale would be its share's (at two ranks w8a8 and fp8 tokens differed from one rank's)."""
    method, full = layer.quant_method, layer.input_size * layer.tp_size
    return isinstance(method, WeightOnlyLinearMethod) and (method.scheme.group_size or full) >= full


def _columns(layer: RowParallelLinear, name: str, loaded: torch.Tensor, start: int, size: int) -> torch.Tensor:
    if loaded.dim() != 2 or loaded.shape[1] != size * layer.tp_size:
        raise ValueError(f"tensor_parallel_size: {layer.prefix}.{name} of shape {tuple(loaded.shape)} does not "
                         f"split into {layer.tp_size} shards of {size} columns")
    return loaded.narrow(1, start, size)


def act_order_share(layer: RowParallelLinear, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The rank's qweight, scales (offsets) and input_perm of an act-order layer from the whole
    layer's (see the module's note), and its method switched to the sub-groups."""
    method = layer.quant_method
    assert isinstance(method, WeightOnlyLinearMethod)
    int4, perm = method.scheme.weights == "int4", parts["input_perm"]
    full_k, share, start = perm.numel(), layer.input_size, layer.tp_rank * layer.input_size
    group = method.scheme.group_size or full_k
    sub = ACT_ORDER_SUB_GROUP if group % ACT_ORDER_SUB_GROUP == 0 else group
    codes = unpack_int4(parts["qweight"], group) if int4 else parts["qweight"]
    mine = ((perm >= start) & (perm < start + share)).nonzero().flatten()  # positions in the permuted order
    slots, sub_groups = [], []
    for g in range(group_count(full_k, group)):
        run = mine[(mine >= g * group) & (mine < (g + 1) * group)]
        if run.numel():
            padded = group_count(run.numel(), sub) * sub
            slots.append(torch.cat([run, run.new_full((padded - run.numel(),), -1)]))
            sub_groups += [g] * (padded // sub)
    order = torch.cat(slots)
    padding = order < 0
    local = torch.where(padding, share, perm[order.clamp(min=0)] - start)  # `share`: the appended zero input
    kept = codes[:, order.clamp(min=0)]
    index = torch.tensor(sub_groups)
    out = {"qweight": pack_int4(kept.contiguous(), sub) if int4 else kept.contiguous(),
           "scales": parts["scales"][:, index].contiguous(), "input_perm": local}
    if int4:
        out["offsets"] = parts["offsets"][:, index].contiguous()
    layer.quant_method = WeightOnlyLinearMethod(replace(method.scheme, group_size=sub), prequantized=True,
                                                act_order=True)
    return out
