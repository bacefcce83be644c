"""replace_attention: every `autodeploy.attention` node becomes the engine's paged attention."""

from __future__ import annotations

import torch
from torch import fx

from llm_engine.autodeploy.paged_attention import PagedAttention
from llm_engine.autodeploy.passes import PassContext, add_module, fake


def _module_path(node: fx.Node, index: int) -> str:
    """The Transformers module the node came from (export's module stack), else a numbered name."""
    stack = node.meta.get("nn_module_stack") or {}
    paths = [path for path, _ in stack.values()]
    return f"{paths[-1]}.paged_attn" if paths and paths[-1] else f"paged_attn_{index}"


def replace_attention(gm: fx.GraphModule, ctx: PassContext) -> str:
    nodes = [n for n in gm.graph.nodes if n.target is torch.ops.autodeploy.attention.default]
    if not nodes:
        raise ValueError("autodeploy: no attention found in the captured graph (the model does not use "
                         "Transformers' attention interface)")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    with gm.graph.inserting_after(placeholders[-1]):
        metadata = gm.graph.placeholder("metadata")
    shapes = set()
    kinds: dict[str, int] = {}
    for index, node in enumerate(nodes):
        q, k, v, scale, window, softcap = node.args
        assert isinstance(q, fx.Node) and isinstance(k, fx.Node) and isinstance(v, fx.Node)
        heads, kv_heads, head_dim = fake(q).shape[1], fake(k).shape[1], fake(q).shape[3]
        if fake(v).shape[3] != head_dim:
            raise ValueError(f"autodeploy: node {node.name!r}: value head size {fake(v).shape[3]} differs from "
                             f"the key's {head_dim} (not supported by the KV pool)")
        shapes.add((kv_heads, head_dim))
        path = _module_path(node, index)
        add_module(gm, path, PagedAttention(heads, kv_heads, head_dim, float(scale), int(window), float(softcap),
                                            ctx.backend))
        with gm.graph.inserting_before(node):
            paged = gm.graph.call_module(path, (q, k, v, metadata))
        paged.meta = dict(node.meta)
        node.replace_all_uses_with(paged)
        gm.graph.erase_node(node)
        kind = "+".join(name for name, on in (("window", window), ("softcap", softcap)) if on) or "causal"
        kinds[kind] = kinds.get(kind, 0) + 1
    if len(shapes) > 1:
        raise ValueError(f"autodeploy: layers differ in KV heads/head size {sorted(shapes)}; the KV pool needs one")
    kv_heads, head_dim = shapes.pop()
    groups = ", ".join(f"{count} {kind}" for kind, count in kinds.items())
    return f"{len(nodes)} layers -> paged attention ({groups}; {kv_heads} KV heads x {head_dim})"
