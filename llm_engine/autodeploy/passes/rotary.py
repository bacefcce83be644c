"""fuse_rotary: Transformers' rotate-half RoPE on a layer's q and k becomes the engine's rotary op.

Transformers computes cos/sin from the positions every step and applies
`x * cos + rotate_half(x) * sin` to q and to k (seven ops each); the engine's `RotaryEmbedding`
rotates both in one kernel call, in place, from tables indexed by position. The tables are the
model's own: the graph's cos/sin subgraph (whatever its RoPE scaling) is run once at build for
every position, so the result is the one Transformers computes. A layer is fused when its q and
k feed the attention straight from the pattern and the tables are duplicated halves (rotate-half
layout). Partial rotary (GPT-NeoX, StableLM, Phi: the first r dims of each head rotated, the rest
concatenated back unchanged) is fused too: its tables are r / 2 wide, which is how the kernel
knows how much of each head to rotate. Interleaved RoPE stays as it is. The kernel rotates in
place only tensors nothing else reads (the q/k columns of a projection's output); others are
copied first.
"""

from __future__ import annotations

import operator

import torch
from torch import fx, nn

from llm_engine.autodeploy.paged_attention import PagedAttention
from llm_engine.autodeploy.passes import PassContext, add_module, fake
from llm_engine.layers.rotary import RotaryEmbedding

aten = torch.ops.aten
_VIEWS = (aten.view.default, aten.transpose.int, aten.unsqueeze.default, aten.slice.Tensor)
_TABLE_STEPS = (aten.unsqueeze.default, aten.to.dtype, aten._to_copy.default)  # between a table and its use


class TableRotary(nn.Module):
    """The engine's rotary op over q [1, heads, T, dim] and k [1, kv_heads, T, dim] (a captured
    graph's layout; tokens first: [1, T, heads, dim]; without the batch dimension: [T, heads, dim] and
    positions [T]) with given cos/sin tables [positions, rotary_dim / 2] (rotary_dim <= dim)."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor, in_place: bool) -> None:
        super().__init__()
        self.rotary = RotaryEmbedding(2 * cos.shape[1], 1, {})
        self.rotary.cos, self.rotary.sin = cos, sin
        self.in_place = in_place
        self.tokens_first = False  # q/k in and out [1, T, heads, dim] (as projected)
        self.batch_dim = True  # False (tokens first only): q/k [T, heads, dim], positions [T]

    def _tokens_first(self, x: torch.Tensor) -> torch.Tensor:
        """[T, heads, dim] with each token's heads contiguous, as the kernel rotates them."""
        if self.batch_dim:
            x = x[0] if self.tokens_first else x[0].transpose(0, 1)
        if not self.in_place:
            return x.clone(memory_format=torch.contiguous_format)
        return x if x.stride(-1) == 1 and x.stride(-2) == x.shape[-1] else x.contiguous()

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = self.rotary(positions[0] if self.batch_dim else positions, self._tokens_first(q), self._tokens_first(k))
        if not self.batch_dim:
            return q, k
        if self.tokens_first:
            return q.unsqueeze(0), k.unsqueeze(0)
        return q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0)


def _other(node: fx.Node, operand: object) -> object:
    """The other operand of a binary node, or None if `operand` is not one of its two."""
    if len(node.args) != 2 or operand not in node.args:
        return None
    return node.args[1] if node.args[0] is operand else node.args[0]


def _rotate_half_input(cat: object) -> fx.Node | None:
    """x when `cat` is `cat([-x[..., half:], x[..., :half]], -1)`."""
    if not (isinstance(cat, fx.Node) and cat.target is aten.cat.default and len(cat.users) == 1):
        return None
    parts = cat.args[0]
    dim = cat.args[1] if len(cat.args) > 1 else 0
    if not (isinstance(parts, (list, tuple)) and len(parts) == 2 and isinstance(parts[0], fx.Node)
            and parts[0].target is aten.neg.default and len(parts[0].users) == 1):
        return None
    second, first = parts[0].args[0], parts[1]
    if not (isinstance(second, fx.Node) and isinstance(first, fx.Node)
            and first.target is second.target is aten.slice.Tensor and first.args[0] is second.args[0]):
        return None
    x = first.args[0]
    assert isinstance(x, fx.Node)
    ndim, width = fake(x).dim(), fake(x).shape[-1]
    last = {-1, ndim - 1}
    half = width // 2
    if not (dim in last and first.args[1] in last and second.args[1] in last and width % 2 == 0
            and tuple(first.args[2:4]) == (0, half) and second.args[2] == half
            and (len(second.args) < 4 or int(second.args[3]) >= width)):  # type: ignore[arg-type]
        return None
    return x if len(first.users) == len(second.users) == 1 else None


def _match(add: object) -> tuple[fx.Node, fx.Node, fx.Node] | None:
    """(x, cos, sin) when `add` is `x * cos + rotate_half(x) * sin` (either operand order)."""
    if not (isinstance(add, fx.Node) and add.target is aten.add.Tensor and len(add.users) == 1):
        return None
    for direct, rotated in (add.args, reversed(add.args)):
        if not (isinstance(direct, fx.Node) and isinstance(rotated, fx.Node) and direct.target is aten.mul.Tensor
                and rotated.target is aten.mul.Tensor and len(direct.users) == len(rotated.users) == 1):
            continue
        for cat in rotated.args:
            x = _rotate_half_input(cat)
            if x is None:
                continue
            cos, sin = _other(direct, x), _other(rotated, cat)
            if isinstance(cos, fx.Node) and isinstance(sin, fx.Node) and len(x.users) == 3:
                return x, cos, sin
    return None


def _column_slice(node: object, start: int) -> fx.Node | None:
    """x when `node` is `x[..., start:end]` (any end; export writes `x[..., :width]` as an alias)."""
    if isinstance(node, fx.Node) and node.target is aten.alias.default and start == 0:
        return node.args[0] if isinstance(node.args[0], fx.Node) else None
    if not (isinstance(node, fx.Node) and node.target is aten.slice.Tensor and len(node.args) >= 3):
        return None
    x = node.args[0]
    assert isinstance(x, fx.Node)
    return x if node.args[1] in (-1, fake(x).dim() - 1) and node.args[2] == start else None


def _rotation(node: object) -> tuple[fx.Node, fx.Node, fx.Node] | None:
    """(x, cos, sin) when `node` is x rotated by the rotate-half pattern: all of each head, or
    (partial rotary) `cat([rope(x[..., :r]), x[..., r:]], -1)`, where the tables are r wide."""
    full = _match(node)
    if full is not None or not (isinstance(node, fx.Node) and node.target is aten.cat.default):
        return full
    parts, dim = node.args[0], node.args[1] if len(node.args) > 1 else 0
    if not (isinstance(parts, (list, tuple)) and len(parts) == 2 and dim in (-1, fake(node).dim() - 1)):
        return None
    partial = _match(parts[0])
    if partial is None:
        return None
    rotated, cos, sin = partial
    kept, width = parts[1], fake(rotated).shape[-1]
    x = _column_slice(rotated, 0)
    if x is None or _column_slice(kept, width) is not x or fake(cos).shape[-1] != width:
        return None
    assert isinstance(kept, fx.Node)  # a slice of x
    only_here = set(x.users) == {rotated, kept} and len(kept.users) == 1
    return (x, cos, sin) if only_here and fake(kept).shape[-1] + width == fake(x).shape[-1] else None


def _table_source(node: fx.Node) -> fx.Node | None:
    """The float32 [1, T, dim] table a [1, 1, T, dim] cos/sin operand is a broadcast (and cast) of."""
    shape = fake(node).shape
    if len(shape) != 4 or shape[0] != 1 or shape[1] != 1:
        return None
    while node.target in _TABLE_STEPS:
        node = node.args[0]  # type: ignore[assignment]  # a tensor node: these ops take one first
    return node if fake(node).dtype == torch.float32 and fake(node).dim() == 3 else None


def _tables(gm: fx.GraphModule, sources: tuple[fx.Node, fx.Node], ctx: PassContext) -> tuple[torch.Tensor, ...] | None:
    """Run the subgraph computing `sources` from the position ids for every position; None if it
    reads anything else or the tables are not in the rotate-half layout. -> (cos, sin) halves."""
    needed: set[fx.Node] = set()
    stack = list(sources)
    while stack:
        node = stack.pop()
        if node not in needed:
            needed.add(node)
            stack.extend(node.all_input_nodes)
    inputs = [n for n in needed if n.op == "placeholder"]
    if [n.target for n in inputs] != ["position_ids"]:
        return None
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if node in needed:
            env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(tuple(env[s] for s in sources))
    positions = torch.arange(ctx.max_positions, device=ctx.device).unsqueeze(0)
    with torch.no_grad():
        full = fx.GraphModule(gm, graph)(positions)
    halves = []
    for table in full:
        table = table.reshape(ctx.max_positions, -1)
        half = table.shape[1] // 2
        if not torch.equal(table[:, :half], table[:, half:]):
            return None
        halves.append(table[:, :half].contiguous())
    return tuple(halves)


def _exclusive(x: fx.Node, gm: fx.GraphModule) -> bool:
    """Whether rotating `x` in place changes nothing else: through its views back to the tensor
    they show, no other node reads it, except disjoint column slices of one projection output."""
    node = x
    while node.target in _VIEWS:
        base = node.args[0]
        assert isinstance(base, fx.Node)
        if node is not x and len(node.users) != 1:
            return False
        if node.target is aten.slice.Tensor and len(base.users) > 1:
            return _disjoint_column_slices(base)
        node = base
    return node is not x and len(node.users) == 1 and node.op in ("call_function", "call_module")


def _disjoint_column_slices(base: fx.Node) -> bool:
    ranges = []
    for user in base.users:  # (the merged projection's own node records no shape; its slices do)
        if user.target is not aten.slice.Tensor or user.args[1] not in (-1, fake(user).dim() - 1) or len(user.args) != 4:
            return False
        ranges.append((int(user.args[2]), int(user.args[3])))  # type: ignore[arg-type]  # ints by construction
    ranges.sort()
    return all(end <= start for (_, end), (start, _) in zip(ranges, ranges[1:]))


def fuse_rotary(gm: fx.GraphModule, ctx: PassContext) -> str:
    positions = next((n for n in gm.graph.nodes if n.op == "placeholder" and n.target == "position_ids"), None)
    attentions = [n for n in gm.graph.nodes
                  if n.op == "call_module" and isinstance(gm.get_submodule(str(n.target)), PagedAttention)]
    tables: dict[tuple[fx.Node, fx.Node], tuple[torch.Tensor, ...] | None] = {}
    fused = 0
    for attention in attentions:
        q_match, k_match = _rotation(attention.args[0]), _rotation(attention.args[1])
        if positions is None or not ctx.max_positions or q_match is None or k_match is None:
            continue
        (q, cos, sin), (k, k_cos, k_sin) = q_match, k_match
        cos_source, sin_source = _table_source(cos), _table_source(sin)
        if (k_cos, k_sin) != (cos, sin) or cos_source is None or sin_source is None:
            continue
        key = (cos_source, sin_source)
        if key not in tables:  # one pair of tables for all the layers that share them
            tables[key] = _tables(gm, key, ctx)
        found = tables[key]
        if found is None:
            continue
        layer_path = f"{str(attention.target).rpartition('.')[0] or f'layer_{fused}'}.engine_rotary"
        add_module(gm, layer_path, TableRotary(found[0], found[1], _exclusive(q, gm) and _exclusive(k, gm)))
        with gm.graph.inserting_before(attention):
            call = gm.graph.call_module(layer_path, (positions, q, k))
            rotated = [gm.graph.call_function(operator.getitem, (call, i)) for i in (0, 1)]
        for new, old in zip(rotated, attention.args[:2]):
            assert isinstance(old, fx.Node)
            new.meta = dict(old.meta)
            old.replace_all_uses_with(new)
        fused += 1
    unfused = len(attentions) - fused
    return f"{fused} layers' q/k -> the engine's rotary op" + (f", {unfused} left as they are" if unfused else "")
