"""Linear passes: projections reading the same input become one matrix (q/k/v, gate/up), and
every projection becomes an engine linear layer, whose QuantMethod the quantization config
then chooses (int8/int4/fp8/... per layer), as for the hand-written models. A checkpoint matrix
that already holds several projections (Phi-3's qkv_proj and gate_up_proj) becomes a merged layer
of those parts, so that tensor parallelism splits each part, not the matrix's rows in two."""

from __future__ import annotations

import operator

import torch
from torch import fx

from llm_engine.autodeploy.passes import PassContext, add_module, fake
from llm_engine.layers.linear import LinearBase, MergedColumnParallelLinear, ReplicatedLinear

aten = torch.ops.aten


class FusedColumnParallelLinear(MergedColumnParallelLinear):
    """One checkpoint tensor holding several projections side by side (q/k/v, gate/up): each rank
    keeps its share of every part; the loader splits the tensor by the parts (vLLM's merged
    loader given no shard)."""

    def weight_loader(self, param: torch.nn.Parameter, loaded: torch.Tensor,
                      shard_id: int | None = None) -> None:
        if shard_id is not None:
            super().weight_loader(param, loaded, shard_id)
            return
        for shard, part in enumerate(loaded.split_with_sizes(self.output_sizes)):
            super().weight_loader(param, part, shard)


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


def along_last(node: fx.Node, dim: object) -> bool:
    """Whether `dim` is `node`'s last dimension (-1, or its index where the shape is recorded)."""
    return dim == -1 or ("val" in node.meta and dim == fake(node).dim() - 1)


def _parts(node: fx.Node, width: int) -> list[int] | None:
    """The widths of the projections a matrix holds, when its output is read only in parts
    along its columns: by slices covering them in order, or by one chunk/split; else None."""
    users = list(node.users)
    if len(users) == 1 and users[0].target in (aten.chunk.default, aten.split.Tensor) \
            and along_last(node, users[0].args[2] if len(users[0].args) > 2 else 0):
        count = users[0].args[1]
        assert isinstance(count, int)
        size = width // count if users[0].target is aten.chunk.default else count
        return [size] * (width // size) if width % size == 0 and width > size else None
    ranges = sorted((min(start, width), min(end, width)) for u in users
                    if u.target is aten.slice.Tensor and len(u.args) == 4 and along_last(node, u.args[1])
                    and isinstance(start := u.args[2], int) and isinstance(end := u.args[3], int))
    starts = [0] + [end for _, end in ranges[:-1]]
    if len(ranges) < 2 or len(ranges) != len(users) or ranges[-1][1] != width \
            or any(start != expected for (start, _), expected in zip(ranges, starts)):
        return None
    return [end - start for start, end in ranges]


def swap_linears(gm: fx.GraphModule, ctx: PassContext) -> str:
    swapped = fused = 0
    for node in list(gm.graph.nodes):
        found = _projection(node, gm)
        if found is None:
            continue
        path, weight, bias = found
        parts = _parts(node, weight.shape[0])
        layer: LinearBase = (ReplicatedLinear(weight.shape[1], weight.shape[0], bias, weight.dtype) if parts is None
                             else FusedColumnParallelLinear(weight.shape[1], parts, bias, weight.dtype))
        add_module(gm, path, layer)
        with gm.graph.inserting_before(node):
            call = gm.graph.call_module(path, (node.args[0],))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        gm.graph.erase_node(node)
        swapped += 1
        fused += parts is not None
    return f"{swapped} linears -> engine linear layers" + (f" ({fused} holding several projections)" if fused else "")


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
