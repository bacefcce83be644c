"""A built engine's quantized row-parallel layer: one rank's share of the packed tensors saved for
one rank (engine_dir._split_for_rank; column-parallel layers need nothing of their own here).

Every quantized tensor (codes, scales, zero points) keeps the output features on dim 0, so a
column-parallel layer's loader, which cuts rows, already hands each rank its share, merged
layers part by part. A row-parallel layer cuts the inputs: its rank takes the codes of its
columns and the scales and zero points of its groups, which is exact only when no group straddles
two ranks. Either each rank's share is a whole number of groups, or the row is one group (int8
per output channel, fp8 per channel or per tensor, a group wider than the row), whose scale and
zero point every rank keeps. Anything else (int4 g128 over 192 inputs at two ranks: 96 each) is
refused naming the layer: no split of a group's scale is right for both halves. int4 codes are
packed two to a byte within each group (pack_int4: element j and j + len/2), so they are unpacked,
cut and packed again for the rank's grouping; cutting the bytes is right only for whole groups.
"""

from __future__ import annotations

import torch

from llm_engine.layers.linear import LinearBase, RowParallelLinear
from llm_engine.layers.quantization import WeightOnlyLinearMethod, pack_int4, unpack_int4


def row_share(full: LinearBase, layer: RowParallelLinear, name: str, saved: torch.Tensor, path: str) -> torch.Tensor:
    """`layer`'s share of `full`'s (the one-rank layer at `path`) saved tensor `name`."""
    method = full.quant_method
    if name == "bias" or not isinstance(method, WeightOnlyLinearMethod):
        return saved  # float layers have their loader; a row-parallel bias is added once, whole
    group, share, rank = method.group(full), layer.input_size, layer.tp_rank
    whole_row = group >= full.input_size
    if not whole_row and share % group:
        raise ValueError(f"tensor_parallel_size: {path} is quantized {method.scheme.describe()}: its "
                         f"{full.input_size} inputs across {layer.tp_size} ranks are {share} each, not whole groups "
                         f"of {group}; rebuild the engine with a group size that divides {share}, or run it at a "
                         f"tensor_parallel_size whose share of every layer's inputs is whole groups")
    if name in ("scales", "offsets"):
        return saved if whole_row else saved.narrow(1, rank * share // group, share // group)
    if name != "qweight":
        raise ValueError(f"tensor_parallel_size: {path}.{name}: a quantized tensor with no known split across ranks")
    if method.scheme.weights != "int4":
        return saved.narrow(1, rank * share, share)
    return pack_int4(unpack_int4(saved, group).narrow(1, rank * share, share).contiguous(), method.group(layer))
