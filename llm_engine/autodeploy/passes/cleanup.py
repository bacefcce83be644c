"""drop_noop_casts: casts to the dtype a tensor already has. Transformers casts around every
norm and rotary (`x.to(torch.float32)`, `.type_as(x)`); in a float32 model each is an op call
per layer and step that returns its input, and it hides a norm's input from the residual fusion."""

from __future__ import annotations

import torch
from torch import fx

from llm_engine.autodeploy.passes import PassContext, fake

aten = torch.ops.aten


def _noop_cast(node: fx.Node) -> fx.Node | None:
    """The input of a cast that returns it unchanged (same dtype, no copy asked), else None."""
    if node.target is aten.to.dtype and len(node.args) == 2 and not node.kwargs:
        dtype = node.args[1]
    elif node.target is aten.type_as.default and isinstance(node.args[1], fx.Node):
        dtype = fake(node.args[1]).dtype
    else:
        return None
    source = node.args[0]
    return source if isinstance(source, fx.Node) and fake(source).dtype == dtype else None


def drop_noop_casts(gm: fx.GraphModule, ctx: PassContext) -> str:
    dropped = 0
    for node in list(gm.graph.nodes):
        source = _noop_cast(node)
        if source is not None:
            node.replace_all_uses_with(source)
            gm.graph.erase_node(node)
            dropped += 1
    return f"{dropped} no-op casts dropped"
