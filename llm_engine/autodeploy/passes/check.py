"""check_supported: the last pass. Every op left must be one that treats tokens independently
(elementwise, shape, per-token reductions, projections) so that packing several sequences
into one token stream stays correct; anything else is named, never run as a silent slow path."""

from __future__ import annotations

import operator

import torch
from torch import fx, nn

from llm_engine.autodeploy.paged_attention import PagedAttention
from llm_engine.autodeploy.passes import PassContext
from llm_engine.autodeploy.passes.rotary import TableRotary
from llm_engine.autodeploy.passes.sharding import GatherColumns
from llm_engine.layers.activation import SiluAndMul
from llm_engine.layers.embedding import VocabParallelEmbedding
from llm_engine.layers.linear import LinearBase
from llm_engine.layers.norm import LayerNorm, RMSNorm

aten = torch.ops.aten
_MODULES = (PagedAttention, LinearBase, RMSNorm, LayerNorm, SiluAndMul, TableRotary, VocabParallelEmbedding,
            GatherColumns)
_OPS = {
    # elementwise
    aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.neg.default, aten.pow.Tensor_Scalar,
    aten.pow.Tensor_Tensor, aten.rsqrt.default, aten.sqrt.default, aten.exp.default, aten.tanh.default,
    aten.sigmoid.default, aten.silu.default, aten.gelu.default, aten.relu.default, aten.sin.default,
    aten.cos.default, aten.clamp.default, aten.where.self, aten.rsub.Scalar, aten.erf.default,
    aten.add.Scalar, aten.mul.Scalar, aten.sub.Scalar, aten.div.Scalar, aten.reciprocal.default,
    # casts and copies
    aten.to.dtype, aten.to.device, aten.to.dtype_layout, aten._to_copy.default, aten.type_as.default,
    aten.contiguous.default, aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default,
    # shapes
    aten.view.default, aten.reshape.default, aten.transpose.int, aten.permute.default, aten.unsqueeze.default,
    aten.squeeze.dim, aten.expand.default, aten.slice.Tensor, aten.select.int, aten.cat.default,
    aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default, aten.flatten.using_ints,
    aten.unflatten.int, aten.sym_size.int, aten.stack.default, aten.repeat_interleave.self_int,
    aten.unbind.int, aten.index.Tensor, aten.matmul.default, aten.bmm.default,
    # per-token reductions and token-wise layers
    aten.mean.dim, aten.sum.dim_IntList, aten.amax.default, aten.softmax.int, aten.layer_norm.default,
    aten.embedding.default, aten.linear.default, aten.dropout.default,
    # rotary tables and constants
    aten.arange.default, aten.arange.start, aten.arange.start_step, aten.full.default, aten.ones.default,
    aten.zeros.default, aten.scalar_tensor.default,
    operator.getitem, operator.mul, operator.add, operator.floordiv, operator.sub,
}


def check_supported(gm: fx.GraphModule, ctx: PassContext) -> str:
    for node in gm.graph.nodes:
        if node.op == "call_module":
            module: nn.Module = gm.get_submodule(str(node.target))
            if not isinstance(module, _MODULES):
                raise ValueError(f"autodeploy: unsupported module call {node.name!r} ({type(module).__name__})")
        elif node.op == "call_function" and node.target not in _OPS:
            where = (node.meta.get("stack_trace") or "").strip().splitlines()[-1:] or ["unknown source"]
            raise ValueError(f"autodeploy: unsupported op {node.target} at node {node.name!r} "
                             f"({where[0].strip()}); no pass maps it onto the engine")
    ops = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_module"))
    return f"all {ops} ops supported"
