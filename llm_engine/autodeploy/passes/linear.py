"""Linear passes: projections reading the same input become one matrix (q/k/v, gate/up), and
every projection becomes an engine linear layer, whose QuantMethod the quantization config
then chooses (int8/int4/fp8/... per layer), as for the hand-written models."""

from __future__ import annotations

import operator

import torch
from torch import fx

from llm_engine.autodeploy.passes import PassContext, add_module
from llm_engine.layers.linear import MergedColumnParallelLinear, ReplicatedLinear

aten = torch.ops.aten


def _projection(node: fx.Node, gm: fx.GraphModule) -> tuple[str, torch.Tensor, bool] | None:
    """(module path, weight, has bias) of a linear node over weights only it reads, else None."""
    if node.target is not aten.linear.default:
        return None
    weight = node.args[1]
    bias = node.args[2] if len(node.args) > 2 else None
    for param in (weight, bias):
        if param is not None and not (isinstance(param, fx.Node) and param.op == "get_attr" and len(param.users) == 1):
            return None
    assert isinstance(weight, fx.Node)
    path = str(weight.target).rpartition(".")[0]
    return path, gm.get_parameter(str(weight.target)), bias is not None


def merge_sibling_linears(gm: fx.GraphModule, ctx: PassContext) -> str:
    """Projections of one module (same parent path) reading the same input, e.g. q/k/v of an
    attention, gate/up of an MLP (an attention and an MLP sharing the input stay apart)."""
    groups: dict[tuple[fx.Node, bool, str], list[tuple[fx.Node, str, torch.Tensor]]] = {}
    for node in gm.graph.nodes:
        found = _projection(node, gm)
        if found is not None and isinstance(node.args[0], fx.Node):
            path, weight, bias = found
            groups.setdefault((node.args[0], bias, path.rpartition(".")[0]), []).append((node, path, weight))
    merged = []
    for (_, bias, parent), members in groups.items():
        if len(members) < 2:
            continue
        leaves = [path.rpartition(".")[2] for _, path, _ in members]
        path = f"{parent}.{'_'.join(leaves)}" if parent else "_".join(leaves)
        sizes = [w.shape[0] for _, _, w in members]
        add_module(gm, path, MergedColumnParallelLinear(members[0][2].shape[1], sizes, bias, members[0][2].dtype))
        first = members[0][0]
        with gm.graph.inserting_before(first):
            fused = gm.graph.call_module(path, (first.args[0],))
        start = 0
        for shard, ((node, old_path, _), size) in enumerate(zip(members, sizes)):
            with gm.graph.inserting_before(node):
                part = gm.graph.call_function(aten.slice.Tensor, (fused, -1, start, start + size))
            part.meta = dict(node.meta)
            node.replace_all_uses_with(part)
            gm.graph.erase_node(node)
            start += size
            for kind in ("weight", "bias") if bias else ("weight",):
                ctx.weight_map[f"{old_path}.{kind}"] = (f"{path}.{kind}", shard)
            ctx.packed_modules[old_path.rpartition(".")[2]] = (path.rpartition(".")[2], shard)
        merged.append("+".join(leaves))
    kinds = sorted(set(merged))
    return f"{len(merged)} merged ({', '.join(kinds)})" if merged else "none"


def swap_linears(gm: fx.GraphModule, ctx: PassContext) -> str:
    swapped = 0
    for node in list(gm.graph.nodes):
        found = _projection(node, gm)
        if found is None:
            continue
        path, weight, bias = found
        add_module(gm, path, ReplicatedLinear(weight.shape[1], weight.shape[0], bias, weight.dtype))
        with gm.graph.inserting_before(node):
            call = gm.graph.call_module(path, (node.args[0],))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        gm.graph.erase_node(node)
        swapped += 1
    return f"{swapped} linears -> engine linear layers"


def _column_range(node: fx.Node) -> tuple[int, int] | None:
    """(start, end) when `node` is a step-1 slice of its input's last dimension, else None."""
    if node.target is not aten.slice.Tensor or len(node.args) != 4 or node.args[1] != -1:
        return None
    start, end = node.args[2:4]
    return (start, end) if isinstance(start, int) and isinstance(end, int) else None


def split_merged_outputs(gm: fx.GraphModule, ctx: PassContext) -> str:
    """A merged projection's output read as slices covering its columns in order (q, k, v)
    becomes one split, as the hand-written layers take it (one op per layer, not one per part)."""
    split = 0
    for node in list(gm.graph.nodes):
        module = gm.get_submodule(str(node.target)) if node.op == "call_module" else None
        if not isinstance(module, MergedColumnParallelLinear):
            continue
        parts = sorted(((found, user) for user in node.users if (found := _column_range(user)) is not None),
                       key=lambda part: part[0])
        ends = [0] + [end for (_, end), _ in parts]
        if (len(parts) < 2 or len(parts) != len(node.users) or ends[-1] != sum(module.output_sizes)  # all ranks' columns
                or any(start != end for ((start, _), _), end in zip(parts, ends))):
            continue
        with gm.graph.inserting_after(node):
            whole = gm.graph.call_function(aten.split_with_sizes.default,
                                           (node, [end - start for (start, end), _ in parts], -1))
        for index, (_, user) in enumerate(parts):
            with gm.graph.inserting_before(user):
                piece = gm.graph.call_function(operator.getitem, (whole, index))
            piece.meta = dict(user.meta)
            user.replace_all_uses_with(piece)
            gm.graph.erase_node(user)
        split += 1
    return f"{split} merged outputs -> one split each"
