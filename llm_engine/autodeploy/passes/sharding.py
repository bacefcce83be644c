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
the ranks. A norm over a whole split projection (OLMo 2's q/k norms over all heads) reads every
rank's share: it gets the all-gathered projection and each rank keeps its columns of the result
(vLLM's way for OLMo 2; the alternative, the norm's weight split and its mean of squares
all-reduced, sends less but needs a norm of its own). Anything else in a block that reads across
heads (a mean over all heads, a view with fixed sizes) is named in an error instead of being split
wrongly.
"""

from __future__ import annotations

import operator

import torch
from torch import fx, nn

from llm_engine.autodeploy.paged_attention import PagedAttention
from llm_engine.autodeploy.passes import PassContext, add_module
from llm_engine.autodeploy.passes.linear import along_last
from llm_engine.autodeploy.passes.rotary import TableRotary
from llm_engine.distributed import all_gather_last_dim, get_tp_rank, get_tp_size
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
from llm_engine.layers.norm import LayerNorm, RMSNorm

aten = torch.ops.aten
SHARD = "tp_shard"
# ops that act on each head (or MLP column) apart; reshapes among them get the rank's sizes
_PER_HEAD_OPS = {aten.view.default, aten.reshape.default, aten.transpose.int, aten.unsqueeze.default,
                aten.squeeze.dim, aten.flatten.using_ints, aten.split_with_sizes.default, aten.slice.Tensor,
                aten.contiguous.default, aten.clone.default, aten.to.dtype, aten._to_copy.default,
                aten.dropout.default, aten.gelu.default, aten.silu.default, aten.tanh.default, aten.relu.default,
                aten.mul.Tensor, aten.add.Tensor, aten.mul.Scalar, aten.add.Scalar, aten.div.Scalar,
                aten.pow.Tensor_Scalar, aten.sigmoid.default, aten.erf.default, operator.getitem,  # GELU written out
                aten.chunk.default, aten.split.Tensor}
# ops that take a projection's columns apart: per head only on a merged projection's parts or along a head's dims
_PART_OPS = {aten.slice.Tensor, aten.split_with_sizes.default, aten.split.Tensor, aten.chunk.default}
_RESHAPES = (aten.view.default, aten.reshape.default)
_REPLICATED_INPUTS = ("position_ids", "metadata")  # the same on every rank
_OPEN = 1 << 62  # a slice's end past any width (export writes `x[..., a:]` with a huge end)
_NORMS = (RMSNorm, LayerNorm)


class VocabParallelHead(ParallelLMHead):
    """The vocab-parallel LM head as a graph module: its forward gives the logits, every rank's
    share of the vocabulary gathered. A bias (Phi's) is split with the vocabulary."""

    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype, bias: bool = False) -> None:
        super().__init__(vocab_size, hidden_size, dtype)
        if bias:
            self.bias = nn.Parameter(torch.zeros(self.shard_size, dtype=dtype), requires_grad=False)
            self.bias.weight_loader = self.weight_loader  # type: ignore[attr-defined]  # the rank's rows, as the table's

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.compute_logits(hidden)


class GatherColumns(nn.Module):
    """Every rank's share of a column-split activation, in rank order: the whole projection,
    for a norm that reads all of it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_gather_last_dim(x)


def _linear(gm: fx.GraphModule, node: fx.Node) -> LinearBase | None:
    if node.op != "call_module":
        return None
    module = gm.get_submodule(str(node.target))
    return module if isinstance(module, LinearBase) else None


def _per_head(gm: fx.GraphModule, node: fx.Node, head_dims: set[int]) -> bool:
    """Whether `node` works on each head (or each column of the MLP's width) on its own."""
    if node.op == "call_function":
        source = node.args[0] if node.args else None
        if node.target in _PART_OPS and isinstance(source, fx.Node):
            layer = _linear(gm, source)
            if layer is not None and not isinstance(layer, MergedColumnParallelLinear):
                return False  # a plain column split would hand each rank the first parts, not a share of each
            if node.target in (aten.chunk.default, aten.split.Tensor) \
                    and not along_last(source, node.args[2] if len(node.args) > 2 else 0):
                return False  # across heads
        return node.target in _PER_HEAD_OPS
    if node.op != "call_module":
        return False
    module = gm.get_submodule(str(node.target))
    if isinstance(module, _NORMS):  # Qwen3's q/k norms over a head; OLMo 2's over all heads, gathered
        return len(node.args) == 1
    return isinstance(module, (PagedAttention, TableRotary, SiluAndMul))


def _gather_for(gm: fx.GraphModule, norm: fx.Node, width: int, tp: int) -> None:
    """`norm(x)` over a split projection's `width` -> `norm(all-gathered x)[..., the rank's columns]`."""
    share, path = _divided(width, tp, norm), f"{norm.target}_gather"
    add_module(gm, path, GatherColumns())
    with gm.graph.inserting_before(norm):
        whole = gm.graph.call_module(path, (norm.args[0],))
    norm.args = (whole,)
    with gm.graph.inserting_after(norm):
        mine = gm.graph.call_function(aten.slice.Tensor, (norm, -1, get_tp_rank() * share, (get_tp_rank() + 1) * share))
    norm.replace_all_uses_with(mine, delete_user_cb=lambda user: user is not mine)


def _replicated(gm: fx.GraphModule) -> set[fx.Node]:
    """Nodes computed from the positions and attention metadata alone (GPT-NeoX's positions
    unsqueezed once for every layer's rotary): the same on every rank, never split."""
    same: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.target in _REPLICATED_INPUTS or node.target is aten.sym_size.int or (
                node.op == "call_function" and node.all_input_nodes and set(node.all_input_nodes) <= same):
            same.add(node)
    return same


def _region(gm: fx.GraphModule, row: fx.Node, head_dims: set[int],
            same: set[fx.Node]) -> tuple[list[fx.Node], list[fx.Node], fx.Node | None]:
    """(the linears feeding `row` through per-head steps, those steps, the first node that is
    neither or that reads a split value from outside) walking back from `row`'s input."""
    columns: list[fx.Node] = []
    inside: list[fx.Node] = []
    stack, seen = list(row.all_input_nodes), set()
    while stack:
        node = stack.pop()
        if node in seen or node in same:
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
    head_dims, same = _head_dims(gm), _replicated(gm)
    plans: list[Plan] = []
    obstacles: dict[fx.Node, fx.Node] = {}
    taken: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if _linear(gm, node) is None:
            continue
        columns, inside, obstacle = _region(gm, node, head_dims, same)
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
        if isinstance(module, _NORMS) and module.weight.shape[-1] not in head_dims:  # over all heads
            _gather_for(gm, node, module.weight.shape[-1], tp)
        elif isinstance(module, PagedAttention):
            attn = module.attn
            module.attn = Attention(_divided(attn.num_heads, tp, node), _divided(attn.num_kv_heads, tp, node),
                                    attn.head_dim, attn.scale, attn.backend)
        elif node.target in _RESHAPES and -1 not in list(node.args[1]):  # type: ignore[arg-type]  # a size list
            node.args = (node.args[0], _local_sizes(list(node.args[1]), head_dims, tp, node))  # type: ignore[arg-type,assignment]
        elif node.target is aten.split_with_sizes.default and node.args[0] in columns:
            sizes = [_divided(int(size), tp, node) for size in node.args[1]]  # type: ignore[arg-type,union-attr]  # ints
            node.args = (node.args[0], sizes, *node.args[2:])
        elif node.target is aten.split.Tensor and node.args[0] in columns:  # equal parts of a merged output
            node.args = (node.args[0], _divided(int(node.args[1]), tp, node), *node.args[2:])  # type: ignore[arg-type]
        elif node.target is aten.slice.Tensor and node.args[0] in columns:  # a column range of a merged output
            start, end = (int(a) for a in node.args[2:4])  # type: ignore[arg-type]  # ints
            node.args = (*node.args[:2], _divided(start, tp, node), end if end >= _OPEN else _divided(end, tp, node))


def _parallel(gm: fx.GraphModule, node: fx.Node, kind: type[ColumnParallelLinear | RowParallelLinear]) -> None:
    """A replicated linear -> `kind` at its path. Merged projections are column-parallel already,
    unless made for another rank count (a built engine, saved for one): then made again for this one.
    The layer keeps its QuantMethod (a built engine's quantized layers take their rank's share)."""
    module = _linear(gm, node)
    if isinstance(module, ReplicatedLinear):
        add_module(gm, str(node.target), kind(module.input_size, module.output_size, module.bias is not None,
                                              module.dtype, module.quant_method))
    elif isinstance(module, MergedColumnParallelLinear) and module.tp_size != get_tp_size():
        add_module(gm, str(node.target), type(module)(module.input_size, module.output_sizes,
                                                      module.bias is not None, module.dtype, module.quant_method))


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
    """`node` (an embedding lookup or the LM head's linear over a table, maybe with a bias) ->
    `kind` over a share of the vocabulary, at the table's module path (the checkpoint names stay)."""
    embedding = node.target is aten.embedding.default
    weight = node.args[0] if embedding else node.args[1]
    bias = None if embedding or len(node.args) < 3 else node.args[2]
    for param in (weight, bias) if bias is not None else (weight,):
        if not (isinstance(param, fx.Node) and param.op == "get_attr" and len(param.users) == 1):
            raise _fail("a vocabulary table or bias read by more than one node", node)
    assert isinstance(weight, fx.Node)
    table = gm.get_parameter(str(weight.target))
    path, _, name = str(weight.target).rpartition(".")
    if name != "weight" or not path or (isinstance(bias, fx.Node) and str(bias.target) != f"{path}.bias"):
        raise _fail("a vocabulary table outside a module", node)
    module = (kind(table.shape[0], table.shape[1], table.dtype) if bias is None
              else VocabParallelHead(table.shape[0], table.shape[1], table.dtype, bias=True))
    for name, buffer in gm.get_submodule(path).named_buffers(recurse=False):  # Gemma's embed_scale, read by the graph
        module.register_buffer(name, buffer)
    add_module(gm, path, module)
    ids_or_hidden = node.args[1] if embedding else node.args[0]
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
        _vocab_module(gm, node, VocabParallelHead)
    return f"{len(heads)} vocab-parallel LM head (split across {get_tp_size()} ranks)"
