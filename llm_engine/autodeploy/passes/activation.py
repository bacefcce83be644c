"""fuse_silu_and_mul: `silu(gate) * up` over the two halves of a merged gate/up projection
becomes the engine's SiluAndMul (one pass over the fused output)."""

from __future__ import annotations

import torch
from torch import fx

from llm_engine.autodeploy.passes import PassContext, add_module
from llm_engine.layers.activation import SiluAndMul
from llm_engine.layers.linear import MergedColumnParallelLinear

aten = torch.ops.aten


def _half(node: object, gm: fx.GraphModule) -> tuple[fx.Node, int, int] | None:
    """(merged projection, start, end) when `node` slices a merged projection's output."""
    if not (isinstance(node, fx.Node) and node.target is aten.slice.Tensor and node.args[1] == -1):
        return None
    source = node.args[0]
    if not (isinstance(source, fx.Node) and source.op == "call_module"
            and isinstance(gm.get_submodule(str(source.target)), MergedColumnParallelLinear)):
        return None
    return source, int(node.args[2]), int(node.args[3])  # type: ignore[arg-type]  # ints by construction


def fuse_silu_and_mul(gm: fx.GraphModule, ctx: PassContext) -> str:
    fused = 0
    for node in list(gm.graph.nodes):
        if node.target is not aten.mul.Tensor or len(node.args) != 2:
            continue
        silu, up = node.args
        if not (isinstance(silu, fx.Node) and silu.target is aten.silu.default and len(silu.users) == 1):
            continue
        gate_half, up_half = _half(silu.args[0], gm), _half(up, gm)
        if gate_half is None or up_half is None or gate_half[0] is not up_half[0]:
            continue
        merged, (_, gate_start, gate_end), (_, up_start, up_end) = gate_half[0], gate_half, up_half
        module = gm.get_submodule(str(merged.target))
        assert isinstance(module, MergedColumnParallelLinear)
        if not (gate_start == 0 and gate_end == up_start and up_end == sum(module.output_sizes) == 2 * gate_end):
            continue
        path = f"{merged.target}_act"
        add_module(gm, path, SiluAndMul())
        with gm.graph.inserting_before(node):
            call = gm.graph.call_module(path, (merged,))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        fused += 1
    return f"{fused} gated MLPs -> SiluAndMul"
