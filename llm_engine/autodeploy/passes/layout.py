"""tokens_first_attention: q/k/v reach the engine's attention (and rotary) as projected,
[1, T, heads, dim], not transposed to Transformers' [1, heads, T, dim] and back.

Transformers transposes each projection to heads-first for its attention; the engine's layers
take tokens first, so each of q, k and v was transposed in the graph and back in the module (with
the rotary op between, twice more): ten view ops per layer and step that the hand-written layers
do not make. A layer is rewritten only when q, k and v all arrive as `transpose(x, 1, 2)` (q and
k possibly through the rotary op), so each module sees one layout.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from llm_engine.autodeploy.paged_attention import PagedAttention
from llm_engine.autodeploy.passes import PassContext
from llm_engine.autodeploy.passes.rotary import TableRotary

aten = torch.ops.aten


def _untransposed(node: object) -> fx.Node | None:
    """x when `node` is `transpose(x, 1, 2)` of a 4-D tensor (heads-first from tokens-first)."""
    if isinstance(node, fx.Node) and node.target is aten.transpose.int and tuple(node.args[1:]) in ((1, 2), (2, 1)):
        source = node.args[0]
        return source if isinstance(source, fx.Node) else None
    return None


def _rotary_output(node: object, gm: fx.GraphModule) -> fx.Node | None:
    """The rotary call when `node` is one of its outputs and its q and k arrive transposed."""
    if not (isinstance(node, fx.Node) and node.target is operator.getitem):
        return None
    call = node.args[0]
    if not (isinstance(call, fx.Node) and call.op == "call_module"
            and isinstance(gm.get_submodule(str(call.target)), TableRotary)):
        return None
    return call if all(_untransposed(arg) is not None for arg in call.args[1:3]) else None


def tokens_first_attention(gm: fx.GraphModule, ctx: PassContext) -> str:
    rewritten = total = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or not isinstance(gm.get_submodule(str(node.target)), PagedAttention):
            continue
        total += 1
        q, k, v = node.args[:3]
        rotary = _rotary_output(q, gm)
        if rotary is not None and _rotary_output(k, gm) is rotary:
            layer_inputs = [_untransposed(v)]
        else:
            rotary, layer_inputs = None, [_untransposed(x) for x in (q, k, v)]
        if any(x is None for x in layer_inputs):
            continue
        if rotary is not None:
            rotary.args = (rotary.args[0], *(_untransposed(x) for x in rotary.args[1:3]))
            rotary_module = gm.get_submodule(str(rotary.target))
            assert isinstance(rotary_module, TableRotary)
            rotary_module.tokens_first = True
            node.args = (q, k, layer_inputs[0], *node.args[3:])
        else:
            node.args = (*layer_inputs, *node.args[3:])
        attention = gm.get_submodule(str(node.target))
        assert isinstance(attention, PagedAttention)
        attention.tokens_first = True
        rewritten += 1
    return f"{rewritten} of {total} attention layers take q/k/v tokens first"
