"""fuse_rms_norm: Transformers' RMSNorm op chains become the engine's fused RMSNorm;
fuse_layer_norm: its LayerNorm calls become the engine's LayerNorm; fuse_add_norm: a residual add
feeding either becomes part of the norm's call.

The chain starts at `rsqrt(mean(x.float() ** 2, -1, keepdim) + eps)`, multiplies x by it and
then by a weight (Llama: `w * y.to(dtype)`; Gemma: `(y * (1 + w.float())).type_as(x)`, whose +1
is folded into the weight at load); casts in between are part of the chain. Chains whose
dtypes differ from the weight's stay unfused (the report counts them).
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from llm_engine.autodeploy.passes import PassContext, add_module, fake
from llm_engine.layers.norm import LayerNorm, RMSNorm

aten = torch.ops.aten
_CASTS = (aten.to.dtype, aten.type_as.default, aten._to_copy.default)


def _weight(node: fx.Node) -> tuple[fx.Node, float] | None:
    """A norm weight operand: get_attr, maybe cast, maybe plus a constant -> (get_attr, offset)."""
    offset = 0.0
    if node.target is aten.add.Tensor and isinstance(node.args[1], (int, float)):
        offset, node = float(node.args[1]), node.args[0]  # type: ignore[assignment]  # checked below
    if isinstance(node, fx.Node) and node.target in _CASTS:
        node = node.args[0]  # type: ignore[assignment]
    return (node, offset) if isinstance(node, fx.Node) and node.op == "get_attr" else None


def _match(rsqrt: fx.Node) -> tuple[fx.Node, fx.Node, float, float, fx.Node] | None:
    """(input, weight get_attr, weight offset, eps, last node of the chain) or None."""
    add = rsqrt.args[0]
    if not (isinstance(add, fx.Node) and add.target is aten.add.Tensor and isinstance(add.args[1], float)):
        return None
    mean = add.args[0]
    if not (isinstance(mean, fx.Node) and mean.target is aten.mean.dim and list(mean.args[1]) == [-1]):  # type: ignore[arg-type]
        return None
    power = mean.args[0]
    if not (isinstance(power, fx.Node) and power.target is aten.pow.Tensor_Scalar and power.args[1] == 2):
        return None
    upcast = power.args[0]
    assert isinstance(upcast, fx.Node)
    source = upcast.args[0] if upcast.target in _CASTS else upcast
    assert isinstance(source, fx.Node)
    scaled = [u for u in rsqrt.users if u.target is aten.mul.Tensor and upcast in u.args]
    if len(rsqrt.users) != 1 or len(scaled) != 1:
        return None
    node, weight = scaled[0], None
    while len(node.users) == 1:
        user = next(iter(node.users))
        if user.target in _CASTS:
            node = user
        elif user.target is aten.mul.Tensor and weight is None:
            other = user.args[1] if user.args[0] is node else user.args[0]
            weight = _weight(other) if isinstance(other, fx.Node) else None
            if weight is None:
                break
            node = user
        else:
            break
    if weight is None:
        return None
    return source, weight[0], weight[1], float(add.args[1]), node


def fuse_rms_norm(gm: fx.GraphModule, ctx: PassContext) -> str:
    fused = skipped = 0
    for rsqrt in [n for n in gm.graph.nodes if n.target is aten.rsqrt.default]:
        match = _match(rsqrt)
        if match is None:
            continue
        source, weight, offset, eps, last = match
        param = gm.get_parameter(str(weight.target))
        if not (fake(source).dtype == fake(last).dtype == param.dtype and param.shape[-1] == fake(source).shape[-1]):
            skipped += 1
            continue
        path = str(weight.target).rpartition(".")[0]
        norm = RMSNorm(param.shape[0], eps, param.dtype)
        norm.weight = param  # meta until loaded; the loader fills it under the same name
        add_module(gm, path, norm)
        if offset:
            ctx.weight_offsets[f"{path}.weight"] = offset
        with gm.graph.inserting_before(last):
            call = gm.graph.call_module(path, (source,))
        call.meta = dict(last.meta)
        last.replace_all_uses_with(call)
        fused += 1
    return f"{fused} RMSNorms fused" + (f", {skipped} left unfused (mixed dtypes)" if skipped else "")


def fuse_layer_norm(gm: fx.GraphModule, ctx: PassContext) -> str:
    """`layer_norm(x, [hidden], weight, bias, eps)` over a module's own weight (and bias) -> the
    engine's LayerNorm at that module's path (the checkpoint names stay)."""
    fused = 0
    for node in [n for n in gm.graph.nodes if n.target is aten.layer_norm.default]:
        source, shape, weight, bias, eps = (*node.args, None, None, 1e-5)[:5]
        eps = node.kwargs.get("eps", eps)
        params = [a for a in (weight, bias) if a is not None]
        if not (isinstance(source, fx.Node) and isinstance(weight, fx.Node)
                and isinstance(shape, (list, tuple)) and len(shape) == 1
                and all(isinstance(p, fx.Node) and p.op == "get_attr" for p in params)):
            continue
        path = str(weight.target).rpartition(".")[0]
        if isinstance(bias, fx.Node) and str(bias.target) != f"{path}.bias":
            continue
        param = gm.get_parameter(str(weight.target))
        if fake(source).dtype != param.dtype:
            continue
        norm = LayerNorm(param.shape[0], float(eps), param.dtype, bias=bias is not None)
        norm.weight = param  # meta until loaded; the loader fills them under the same names
        if bias is not None:
            norm.bias = gm.get_parameter(f"{path}.bias")
        add_module(gm, path, norm)
        with gm.graph.inserting_before(node):
            call = gm.graph.call_module(path, (source,))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        gm.graph.erase_node(node)
        fused += 1
    return f"{fused} LayerNorms -> the engine's LayerNorm"


# ops whose output is a new tensor (never a view of an input): a residual they made may be updated in place
_NORMS = (RMSNorm, LayerNorm)
_FRESH = {aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.embedding.default}


def _fresh(node: fx.Node, gm: fx.GraphModule) -> bool:
    """`node`'s value is a tensor of its own: a fresh op's output, an engine layer's, or the
    residual half of an add + norm already fused."""
    if node.op == "call_module":
        return True
    if node.target is operator.getitem and isinstance(node.args[0], fx.Node) and node.args[0].op == "call_module":
        return isinstance(gm.get_submodule(str(node.args[0].target)), _NORMS)
    return node.op == "call_function" and node.target in _FRESH


def _updatable(residual: fx.Node, add: fx.Node, order: dict[fx.Node, int], gm: fx.GraphModule) -> bool:
    """Whether `add` may write its sum into `residual`: it is a contiguous tensor of its own,
    and all its other readers run before `add` and make new tensors (no view of it outlives
    `add`)."""
    if not (_fresh(residual, gm) and fake(residual).is_contiguous()):
        return False
    return all(user is add or (order[user] < order[add] and _fresh(user, gm)) for user in residual.users)


def fuse_add_norm(gm: fx.GraphModule, ctx: PassContext) -> str:
    """`norm(residual + x)` becomes the engine's fused add + RMSNorm (one kernel pass that leaves
    the sum in `residual`, as the hand-written decoder layers do) or add + LayerNorm (the add in
    place); other readers of the sum (the next residual add) read it from there."""
    fused = {RMSNorm: 0, LayerNorm: 0}
    for norm in [n for n in gm.graph.nodes if n.op == "call_module"]:
        module = gm.get_submodule(str(norm.target))
        add = norm.args[0]
        if not (isinstance(module, _NORMS) and len(norm.args) == 1 and isinstance(add, fx.Node)
                and add.target is aten.add.Tensor and len(add.args) == 2 and add.args[0] is not add.args[1]
                and all(isinstance(a, fx.Node) for a in add.args)):
            continue
        order = {node: index for index, node in enumerate(gm.graph.nodes)}
        a, b = add.args
        assert isinstance(a, fx.Node) and isinstance(b, fx.Node)
        if not (fake(a).shape == fake(b).shape == fake(add).shape and fake(a).dtype == fake(b).dtype == module.weight.dtype):
            continue
        residual, x = (a, b) if _updatable(a, add, order, gm) else (b, a)
        if not _updatable(residual, add, order, gm):
            continue
        with gm.graph.inserting_before(add):  # the sum's other readers may come before the norm
            call = gm.graph.call_module(str(norm.target), (x, residual))
            normed = gm.graph.call_function(operator.getitem, (call, 0))
            summed = gm.graph.call_function(operator.getitem, (call, 1))
        call.meta = {}
        normed.meta, summed.meta = dict(norm.meta), dict(add.meta)
        norm.replace_all_uses_with(normed)
        gm.graph.erase_node(norm)
        add.replace_all_uses_with(summed)
        gm.graph.erase_node(add)
        fused[type(module)] += 1
    return ", ".join(f"{count} residual adds fused into {kind.__name__}" for kind, count in fused.items()
                     if count or kind is RMSNorm)
