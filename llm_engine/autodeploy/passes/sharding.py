"""Tensor-parallel sharding of a captured graph (Megatron's layout, as the hand-written layers split it).

The plan is read off the graph: walking back from each engine linear's input, if only per-head
or elementwise steps (views, splits, rotary, paged attention, per-head norms, activations) lie
between it and other linears, those linears are column-parallel (each rank computes its share of
the heads or of the MLP's width) and it is row-parallel (each rank multiplies its share of the
input, then one all-reduce). That gives q/k/v and gate/up column, o and down row, with no
architecture names. The token embedding and the LM head are vocab-parallel. Every node so split
is annotated (`node.meta["tp_shard"]`: column, row or vocab) at any tensor_parallel_size; with
more than one rank the pass also rewrites the graph for the rank's share: parallel linear
layers, attention over its heads, split sizes and column slices of a column output divided by
the ranks. Anything in a block that reads across heads (a norm over all heads' q, a view with
fixed sizes) is named in an error instead of being split wrongly.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from llm_engine.autodeploy.paged_attention import PagedAttention
from llm_engine.autodeploy.passes import PassContext, add_module
from llm_engine.autodeploy.passes.rotary import TableRotary
from llm_engine.distributed import get_tp_size
from llm_engine.layers.activation import SiluAndMul
from llm_engine.layers.attention import Attention
from llm_engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from llm_engine.layers.linear import (
    ColumnParallelLinear,
    LinearBase,
    MergedColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from llm_engine.layers.norm import RMSNorm

aten = torch.ops.aten
SHARD = "tp_shard"
# ops that act on each head (or MLP column) apart; reshapes among them get the rank's sizes
_PER_HEAD_OPS = {aten.view.default, aten.reshape.default, aten.transpose.int, aten.unsqueeze.default,
                aten.squeeze.dim, aten.flatten.using_ints, aten.split_with_sizes.default, aten.slice.Tensor,
                aten.contiguous.default, aten.clone.default, aten.to.dtype, aten._to_copy.default,
                aten.dropout.default, aten.gelu.default, aten.silu.default, aten.tanh.default, aten.relu.default,
                aten.mul.Tensor, aten.add.Tensor, aten.mul.Scalar, aten.add.Scalar, aten.div.Scalar,
                aten.pow.Tensor_Scalar, aten.sigmoid.default, aten.erf.default, operator.getitem}  # GELU written out
_RESHAPES = (aten.view.default, aten.reshape.default)
_REPLICATED_INPUTS = ("position_ids", "metadata")  # the same on every rank
_OPEN = 1 << 62  # a slice's end past any width (export writes `x[..., a:]` with a huge end)


class VocabParallelHead(ParallelLMHead):
    """The vocab-parallel LM head as a graph module: its forward gives the logits, every rank's
    share of the vocabulary gathered."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.compute_logits(hidden)


def _linear(gm: fx.GraphModule, node: fx.Node) -> LinearBase | None:
    if node.op != "call_module":
        return None
    module = gm.get_submodule(str(node.target))
    return module if isinstance(module, LinearBase) else None


def _per_head(gm: fx.GraphModule, node: fx.Node, head_dims: set[int]) -> bool:
    """Whether `node` works on each head (or each column of the MLP's width) on its own."""
    if node.op == "call_function":
        return node.target in _PER_HEAD_OPS
    if node.op != "call_module":
        return False
    module = gm.get_submodule(str(node.target))
    if isinstance(module, RMSNorm):  # Qwen3's q/k norms over one head's dims, not OLMo 2's over all heads
        return module.weight.shape[-1] in head_dims
    return isinstance(module, (PagedAttention, TableRotary, SiluAndMul))


def _region(gm: fx.GraphModule, row: fx.Node, head_dims: set[int]) -> tuple[list[fx.Node], list[fx.Node], fx.Node | None]:
    """(the linears feeding `row` through per-head steps, those steps, the first node that is
    neither or that reads a split value from outside) walking back from `row`'s input."""
    columns: list[fx.Node] = []
    inside: list[fx.Node] = []
    stack, seen = list(row.all_input_nodes), set()
    while stack:
        node = stack.pop()
        if node in seen or node.target is aten.sym_size.int or node.target in _REPLICATED_INPUTS:
            continue
        seen.add(node)
        if _linear(gm, node) is not None:
            columns.append(node)
        elif _per_head(gm, node, head_dims):
            inside.append(node)
            stack.extend(node.all_input_nodes)
        else:
            return [], [], node
    block = {row, *inside}
    leak = next((user for node in columns + inside for user in node.users if user not in block), None)
    return ([], [], leak) if leak is not None else (columns, inside, None)


Plan = tuple[fx.Node, list[fx.Node], list[fx.Node]]  # (row linear, its column linears, the nodes between)


def _head_dims(gm: fx.GraphModule) -> set[int]:
    return {m.attn.head_dim for m in gm.modules() if isinstance(m, PagedAttention)}


def _plan(gm: fx.GraphModule) -> tuple[list[Plan], dict[fx.Node, fx.Node]]:
    """(the column/row blocks, {linear: the node that stops it being a row})."""
    head_dims = _head_dims(gm)
    plans: list[Plan] = []
    obstacles: dict[fx.Node, fx.Node] = {}
    taken: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if _linear(gm, node) is None:
            continue
        columns, inside, obstacle = _region(gm, node, head_dims)
        if obstacle is not None:
            obstacles[node] = obstacle
        elif columns and node not in taken and not taken.intersection(columns):
            plans.append((node, columns, inside))
            taken.update([node, *columns])
    return plans, obstacles


def _fail(what: str, node: fx.Node) -> ValueError:
    return ValueError(f"autodeploy: tensor parallelism: {what}: node {node.name!r} ({node.target})")


def _divided(value: int, tp: int, node: fx.Node) -> int:
    if value % tp:
        raise _fail(f"{value} does not split evenly across {tp} ranks", node)
    return value // tp


def _local_sizes(sizes: list[object], head_dims: set[int], tp: int, node: fx.Node) -> list[object]:
    """A reshape written with the model's head count (StableLM's `view(T, heads, head_dim)`) or
    width, for one rank's share: the heads before a head size, else the one fixed size."""
    fixed = [i for i, size in enumerate(sizes) if isinstance(size, int)]
    if len(sizes) >= 2 and isinstance(sizes[-2], int) and sizes[-1] in head_dims:
        at = len(sizes) - 2
    elif len(fixed) == 1:
        at = fixed[0]
    else:
        raise _fail("a reshape of a split projection with sizes that name no heads", node)
    return [_divided(int(size), tp, node) if i == at else size for i, size in enumerate(sizes)]  # type: ignore[call-overload]


def _split_block(gm: fx.GraphModule, plan: Plan, tp: int, head_dims: set[int]) -> None:
    """The steps between column and row linears, for one rank's share of the columns."""
    _, columns, inside = plan
    for node in inside:
        module = gm.get_submodule(str(node.target)) if node.op == "call_module" else None
        if isinstance(module, PagedAttention):
            attn = module.attn
            module.attn = Attention(_divided(attn.num_heads, tp, node), _divided(attn.num_kv_heads, tp, node),
                                    attn.head_dim, attn.scale, attn.backend)
        elif node.target in _RESHAPES and -1 not in list(node.args[1]):  # type: ignore[arg-type]  # a size list
            node.args = (node.args[0], _local_sizes(list(node.args[1]), head_dims, tp, node))  # type: ignore[arg-type,assignment]
        elif node.target is aten.split_with_sizes.default and node.args[0] in columns:
            sizes = [_divided(int(size), tp, node) for size in node.args[1]]  # type: ignore[arg-type,union-attr]  # ints
            node.args = (node.args[0], sizes, *node.args[2:])
        elif node.target is aten.slice.Tensor and node.args[0] in columns:  # a column range of a merged output
            start, end = (int(a) for a in node.args[2:4])  # type: ignore[arg-type]  # ints
            node.args = (*node.args[:2], _divided(start, tp, node), end if end >= _OPEN else _divided(end, tp, node))


def _parallel(gm: fx.GraphModule, node: fx.Node, kind: type[ColumnParallelLinear | RowParallelLinear]) -> None:
    """A replicated linear -> `kind` at its path (merged projections are column-parallel already)."""
    module = _linear(gm, node)
    if isinstance(module, ReplicatedLinear):
        add_module(gm, str(node.target), kind(module.input_size, module.output_size, module.bias is not None,
                                              module.dtype))


def _next_linears(gm: fx.GraphModule, node: fx.Node) -> list[fx.Node]:
    """The linears `node`'s output reaches first, going forward."""
    found, stack, seen = [], list(node.users), set()
    while stack:
        user = stack.pop()
        if user not in seen:
            seen.add(user)
            if _linear(gm, user) is not None:
                found.append(user)
            else:
                stack.extend(user.users)
    return found


def shard_tensor_parallel(gm: fx.GraphModule, ctx: PassContext) -> str:
    tp = get_tp_size()
    plans, obstacles = _plan(gm)
    for row, columns, _ in plans:
        row.meta[SHARD] = "row"
        for column in columns:
            column.meta[SHARD] = "column"
    embeddings = [n for n in gm.graph.nodes if n.target is aten.embedding.default]
    for node in embeddings:
        node.meta[SHARD] = "vocab"
    replicated = [n for n in gm.graph.nodes if _linear(gm, n) is not None and SHARD not in n.meta]
    summary = (f"{sum(len(columns) for _, columns, _ in plans)} column / {len(plans)} row linears, "
               f"{len(embeddings)} vocab-parallel embeddings, {len(replicated)} linears replicated")
    if tp == 1:
        return f"{summary} (annotated; one rank)"
    split = {node for _, _, inside in plans for node in inside}
    for node in gm.graph.nodes:
        if node.op == "call_module" and isinstance(gm.get_submodule(str(node.target)), PagedAttention) \
                and node not in split:
            reasons = [obstacles[n] for n in _next_linears(gm, node) if n in obstacles]
            raise _fail("an attention block that reads across heads", reasons[0] if reasons else node)
    for node in replicated:
        if isinstance(_linear(gm, node), MergedColumnParallelLinear):
            raise _fail("merged projections that no row-parallel linear reads", node)
    head_dims = _head_dims(gm)
    for plan in plans:
        _split_block(gm, plan, tp, head_dims)
        _parallel(gm, plan[0], RowParallelLinear)
        for column in plan[1]:
            _parallel(gm, column, ColumnParallelLinear)
    for node in embeddings:
        _vocab_module(gm, node, VocabParallelEmbedding)
    return f"{summary} (split across {tp} ranks)"


def _vocab_module(gm: fx.GraphModule, node: fx.Node, kind: type[VocabParallelEmbedding]) -> None:
    """`node` (an embedding lookup or the LM head's linear over a table) -> `kind` over a share of
    the vocabulary, at the table's module path (the checkpoint names stay)."""
    weight = node.args[0] if node.target is aten.embedding.default else node.args[1]
    if not (isinstance(weight, fx.Node) and weight.op == "get_attr" and len(weight.users) == 1):
        raise _fail("a vocabulary table read by more than one node", node)
    table = gm.get_parameter(str(weight.target))
    path, _, name = str(weight.target).rpartition(".")
    if name != "weight" or not path:
        raise _fail("a vocabulary table outside a module", node)
    add_module(gm, path, kind(table.shape[0], table.shape[1], table.dtype))
    ids_or_hidden = node.args[1] if node.target is aten.embedding.default else node.args[0]
    with gm.graph.inserting_before(node):
        call = gm.graph.call_module(path, (ids_or_hidden,))
    call.meta = dict(node.meta)
    node.replace_all_uses_with(call)
    gm.graph.erase_node(node)


def shard_lm_head(gm: fx.GraphModule, ctx: PassContext) -> str:
    """The head graph's LM head (the linear the logits come from) -> vocab-parallel with more than one rank."""
    heads = [n for n in gm.graph.nodes if n.target is aten.linear.default]
    for node in heads:
        node.meta[SHARD] = "vocab"
    if get_tp_size() == 1:
        return f"{len(heads)} vocab-parallel LM head (annotated; one rank)"
    for node in heads:
        if len(node.args) > 2 and node.args[2] is not None:
            raise _fail("an LM head with a bias (Phi's) is not split yet", node)
        _vocab_module(gm, node, VocabParallelHead)
    return f"{len(heads)} vocab-parallel LM head (split across {get_tp_size()} ranks)"
