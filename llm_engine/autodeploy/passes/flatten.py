"""flatten_batch: the graph without Transformers' batch dimension of 1. Its tensor inputs lose
their leading dimension ([1, T] -> [T]) and so does every activation after them ([T, hidden],
[T, heads, dim]), so the engine's linears multiply 2-D tensors and its attention and rotary take
q/k/v as they are, as in the hand-written models.

Export keeps input_ids' [1, T] through the whole graph: each engine linear then multiplied a
3-D tensor (a reshape to 2-D and back inside every projection) and the attention and rotary
modules indexed [0] and unsqueezed around every call: about 1,000 view ops per decoded token on
SmolLM2-135M that the hand-written path never dispatches. Each node reading a flattened tensor is
rewritten for the shorter shape (dims shifted down by one, a leading 1 dropped from view and
expand sizes); an op no rule knows gets its input back with `unsqueeze(0)` (correct, one view op
more), so the pass never changes what the graph computes, only its inputs' and output's rank.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
from torch import fx

from llm_engine.autodeploy.paged_attention import PagedAttention
from llm_engine.autodeploy.passes import PassContext, fake
from llm_engine.autodeploy.passes.rotary import TableRotary
from llm_engine.layers.activation import SiluAndMul
from llm_engine.layers.linear import LinearBase
from llm_engine.layers.norm import LayerNorm, RMSNorm

aten = torch.ops.aten
# the op's first argument shapes the output and the rest are not tensors (or only lend a dtype)
_UNARY = {
    aten.neg.default, aten.rsqrt.default, aten.sqrt.default, aten.exp.default, aten.tanh.default,
    aten.sigmoid.default, aten.silu.default, aten.gelu.default, aten.relu.default, aten.sin.default,
    aten.cos.default, aten.erf.default, aten.reciprocal.default, aten.pow.Tensor_Scalar, aten.clamp.default,
    aten.add.Scalar, aten.mul.Scalar, aten.sub.Scalar, aten.div.Scalar, aten.rsub.Scalar,
    aten.to.dtype, aten.to.device, aten.to.dtype_layout, aten._to_copy.default, aten.type_as.default,
    aten.contiguous.default, aten.clone.default, aten.alias.default, aten.detach.default, aten.dropout.default,
    aten.linear.default, aten.layer_norm.default,
}
_BROADCAST = {aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.pow.Tensor_Tensor,
              aten.where.self}
# ops with dimension arguments: ((position, default), ...)
_DIM_ARGS: dict[object, tuple[tuple[int, int | None], ...]] = {
    aten.slice.Tensor: ((1, 0),), aten.select.int: ((1, None),), aten.softmax.int: ((1, None),),
    aten.split.Tensor: ((2, 0),), aten.split_with_sizes.default: ((2, 0),), aten.chunk.default: ((2, 0),),
    aten.sym_size.int: ((1, None),), aten.transpose.int: ((1, None), (2, None)),
    aten.flatten.using_ints: ((1, 0), (2, -1)),
}
_REDUCTIONS = {aten.mean.dim, aten.sum.dim_IntList, aten.amax.default}
_TOKEN_WISE_MODULES = (LinearBase, RMSNorm, LayerNorm, SiluAndMul)
_RESHAPES = {aten.view.default, aten.reshape.default}


def _shifted(dim: int, rank: int) -> int | None:
    """`dim` of a rank-`rank` tensor on the tensor without its first dimension (negative dims
    count from the end and stay as they are); None for the first dimension itself."""
    if dim == 0 or dim == -rank:
        return None
    return dim if dim < 0 else dim - 1


def _merges_heads(node: fx.Node) -> bool:
    """Whether `node` reshapes an attention output [1, T, heads, dim] to [1, T, heads * dim] (a
    reshape's result is fixed by its shape alone: the same elements in the same order)."""
    if node.target not in (*_RESHAPES, aten.flatten.using_ints) or "val" not in node.meta:
        return False
    source, shape = fake(node.args[0]).shape, fake(node).shape  # type: ignore[arg-type]  # the attention node
    return len(shape) == 3 and shape[0] == 1 and shape[-1] == source[-2] * source[-1]


class _Flattener:
    """Walks the graph once, rewriting nodes in place; `flat` holds those whose value had the
    batch dimension and now has not."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm, self.graph = gm, gm.graph
        self.flat: set[fx.Node] = set()
        self.rank: dict[fx.Node, int] = {}  # each flattened node's rank before the pass
        self.restored: dict[fx.Node, fx.Node] = {}
        self.fallbacks = 0
        self.erased: set[fx.Node] = set()  # reshapes made redundant (they are still in run's node list)

    def _ndim(self, node: fx.Node) -> int | None:
        """The node's rank as recorded (a parameter's own rank for get_attr), else None."""
        value = operator.attrgetter(str(node.target))(self.gm) if node.op == "get_attr" else node.meta.get("val")
        return value.dim() if isinstance(value, torch.Tensor) else None

    def _mark(self, node: fx.Node, rank: int | None) -> None:
        self.flat.add(node)
        if rank is not None:
            self.rank[node] = rank
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            node.meta["val"] = value[0]
        elif isinstance(value, (list, tuple)):
            node.meta["val"] = type(value)(v[0] if isinstance(v, torch.Tensor) else v for v in value)

    def _restore(self, node: fx.Node) -> fx.Node:
        """`node`'s value with the batch dimension back (one unsqueeze, shared by its readers)."""
        if node not in self.restored:
            with self.graph.inserting_after(node):
                restored = self.graph.call_function(aten.unsqueeze.default, (node, 0))
            restored.meta = {"val": fake(node).unsqueeze(0)} if "val" in node.meta else {}
            self.restored[node] = restored
            self.fallbacks += 1
        return self.restored[node]

    def run(self) -> int:
        for node in list(self.graph.nodes):
            if node in self.erased:
                continue
            if node.op == "placeholder":
                value = node.meta.get("val")
                if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == 1:
                    self._mark(node, value.dim())
            elif node.op == "output":
                result = node.args[0]
                if isinstance(result, fx.Node) and result not in self.flat:
                    with self.graph.inserting_before(node):
                        squeezed = self.graph.call_function(aten.select.int, (result, 0, 0))
                    node.args = (squeezed,)
            elif any(arg in self.flat for arg in node.all_input_nodes):
                if not self._rewrite(node):
                    node.args = fx.node.map_arg(node.args, lambda a: self._restore(a) if a in self.flat else a)
                    node.kwargs = fx.node.map_arg(node.kwargs, lambda a: self._restore(a) if a in self.flat else a)
        return len(self.flat)

    def _rewrite(self, node: fx.Node) -> bool:
        """Rewrite `node` in place for its flattened inputs; False when no rule applies."""
        if any(isinstance(value, fx.Node) for value in node.kwargs.values()):
            return False
        if node.op == "call_module":
            return self._module(node)
        rule = _RULES.get(node.target)
        if rule is None:
            return False
        rank = self._ndim(node)
        done = rule(self, node)
        if done and node in self.flat and rank is not None:
            self.rank[node] = rank
        return done

    def _module(self, node: fx.Node) -> bool:
        module = self.gm.get_submodule(str(node.target))
        tensors = [a for a in node.args if isinstance(a, fx.Node) and (self._ndim(a) is not None or a in self.flat)]
        if not all(a in self.flat for a in tensors):
            return False
        rank = self._ndim(node)
        if isinstance(module, PagedAttention):
            if not (module.tokens_first and self._calls(node) == 1 and node.users
                    and all(_merges_heads(u) for u in node.users)):
                return False
            module.batch_dim = False  # its output [T, heads * dim] is what the users' reshapes made
            rank, node.meta["val"] = 3, fake(next(iter(node.users)))
            for user in list(node.users):
                user.replace_all_uses_with(node)
                self.graph.erase_node(user)
                self.erased.add(user)
        elif isinstance(module, TableRotary):
            if not module.tokens_first or self._calls(node) != 1:
                return False
            module.batch_dim = False
        elif isinstance(module, _TOKEN_WISE_MODULES):
            if rank is None:  # nodes the passes made record no shape: the input's rank
                rank = self.rank.get(tensors[0])
        else:
            return False
        self._mark(node, rank)
        return True

    def _calls(self, node: fx.Node) -> int:
        return sum(1 for n in self.graph.nodes if n.op == "call_module" and n.target == node.target)

    # rules: each rewrites node.args for flattened inputs and marks the node if its value is flattened

    def unary(self, node: fx.Node) -> bool:
        """Any other tensor operand lends only a dtype (type_as) or is a parameter (linear, layer_norm)."""
        if node.args[0] not in self.flat or any(a in self.flat for a in node.all_input_nodes[1:]
                                                if node.target is not aten.type_as.default):
            return False
        self._mark(node, None)
        return True

    def broadcast(self, node: fx.Node) -> bool:
        """Elementwise over broadcast operands: a flattened operand must have had the output's
        rank; any other must be shorter than it (so it never reached the batch dimension)."""
        rank = self._ndim(node)
        if rank is None:
            return False
        for arg in node.all_input_nodes:
            if arg in self.flat:
                if self.rank.get(arg) != rank:
                    return False
            else:
                other = self._ndim(arg)
                if other is None or other >= rank:  # unknown rank: left as it is
                    return False
        self._mark(node, rank)
        return True

    def dim_args(self, node: fx.Node) -> bool:
        source = node.args[0]
        if node.kwargs or not (isinstance(source, fx.Node) and source in self.flat and source in self.rank):
            return False
        args = list(node.args)
        for position, default in _DIM_ARGS[node.target]:
            dim = args[position] if position < len(args) else default
            if not isinstance(dim, int):
                return False
            if _shifted(dim, self.rank[source]) is None:
                return False
            while len(args) <= position:
                args.append(default)
            args[position] = _shifted(dim, self.rank[source])
        node.args = tuple(args)
        if node.target is not aten.sym_size.int:
            self._mark(node, None)
        return True

    def reduction(self, node: fx.Node) -> bool:
        source, dims = node.args[0], node.args[1] if len(node.args) > 1 else []
        if node.kwargs or not (isinstance(source, fx.Node) and source in self.rank and isinstance(dims, (list, tuple)) and dims):
            return False
        shifted = [_shifted(d, self.rank[source]) for d in dims]
        if None in shifted:
            return False
        node.args = (source, shifted, *node.args[2:])
        self._mark(node, None)
        return True

    def reshape(self, node: fx.Node) -> bool:
        """Same elements in the same order: a view of the flattened tensor to the same shape is
        the same value; a leading 1 in the shape is the batch dimension and is dropped."""
        source, shape = node.args[0], node.args[1]
        if not (source in self.flat and isinstance(shape, (list, tuple))):
            return False
        if shape and shape[0] == 1 and self._ndim(node) == len(shape):
            node.args = (source, list(shape[1:]))
            self._mark(node, len(shape))
        return True

    def unsqueeze(self, node: fx.Node) -> bool:
        source, dim = node.args
        if not (isinstance(source, fx.Node) and source in self.rank and isinstance(dim, int)):
            return False
        if _shifted(dim, self.rank[source] + 1) is None:
            return False
        node.args = (source, _shifted(dim, self.rank[source] + 1))
        self._mark(node, None)
        return True

    def permute(self, node: fx.Node) -> bool:
        source, dims = node.args
        if not (isinstance(source, fx.Node) and source in self.rank and isinstance(dims, (list, tuple))):
            return False
        rank = self.rank[source]
        if not dims or dims[0] % rank != 0:  # type: ignore[operator]  # ints by the schema
            return False
        node.args = (source, [_shifted(d, rank) for d in dims[1:]])  # type: ignore[arg-type]
        self._mark(node, None)
        return True

    def expand(self, node: fx.Node) -> bool:
        source, sizes = node.args[:2]
        if not (isinstance(source, fx.Node) and source in self.rank and isinstance(sizes, (list, tuple))
                and len(sizes) == self.rank[source]
                and sizes[0] in (1, -1) and len(node.args) == 2):
            return False
        node.args = (source, list(sizes[1:]))
        self._mark(node, None)
        return True

    def cat(self, node: fx.Node) -> bool:
        """cat or stack of flattened tensors of one rank (stack's dim counts the new dimension)."""
        parts, dim = node.args[0], node.args[1] if len(node.args) > 1 else 0
        if node.kwargs or not (isinstance(parts, (list, tuple)) and isinstance(dim, int)):
            return False
        ranks = {self.rank.get(p) if isinstance(p, fx.Node) else None for p in parts}
        rank = ranks.pop() if len(ranks) == 1 else None
        if rank is None:
            return False
        shifted = _shifted(dim, rank + (node.target is aten.stack.default))
        if shifted is None:
            return False
        node.args = (parts, shifted)
        self._mark(node, None)
        return True

    def embedding(self, node: fx.Node) -> bool:
        if node.args[0] in self.flat:  # the weights
            return False
        self._mark(node, None)
        return True

    def getitem(self, node: fx.Node) -> bool:
        self._mark(node, None)
        return True


_RULES: dict[object, Callable[[_Flattener, fx.Node], bool]] = {
    **{op: _Flattener.unary for op in _UNARY},
    **{op: _Flattener.broadcast for op in _BROADCAST},
    **{op: _Flattener.dim_args for op in _DIM_ARGS},
    **{op: _Flattener.reduction for op in _REDUCTIONS},
    **{op: _Flattener.reshape for op in _RESHAPES},
    aten.unsqueeze.default: _Flattener.unsqueeze, aten.permute.default: _Flattener.permute,
    aten.expand.default: _Flattener.expand, aten.cat.default: _Flattener.cat, aten.stack.default: _Flattener.cat,
    aten.embedding.default: _Flattener.embedding, operator.getitem: _Flattener.getitem,
}


def flatten_batch(gm: fx.GraphModule, ctx: PassContext) -> str:
    flattener = _Flattener(gm)
    flattened = flattener.run()
    return (f"{flattened} nodes without the batch dimension, "
            f"{flattener.fallbacks} given it back for an op no rule knows")
