"""Capture a Hugging Face causal LM as an FX graph with torch.export.

Why torch.export (non-strict) and not torch.fx.symbolic_trace: Transformers' current models
build masks, rotary tables and outputs with data-dependent Python that symbolic tracing cannot
follow, while export runs the real code on fake tensors and records ATen ops, so one capture
path serves every architecture. The model is built with its parameters on the meta device (no
weight memory; buffers such as rotary `inv_freq` are computed for real) and its attention goes
through `torch.ops.autodeploy.attention`, registered as a Transformers attention implementation:
one opaque node per layer with q/k/v after the model's own RoPE, which the attention pass then
swaps for the engine's paged attention. With a registered implementation Transformers builds no
mask, so nothing in the graph depends on the batch layout and sequences can be packed end to end.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn

if TYPE_CHECKING:
    from transformers import PretrainedConfig

ATTENTION_IMPL = "codeyard_autodeploy"
_EXPORT_TOKENS = 8  # sample length; the token dimension is exported dynamic


@torch.library.custom_op("autodeploy::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, sliding_window: int,
              softcap: float) -> torch.Tensor:
    """Causal attention of one sequence in Transformers' layout: q [1, heads, T, dim], k/v
    [1, kv_heads, T, dim] -> [1, T, heads, dim]. The captured graph runs with this before the
    attention pass (tests compare it with Transformers); after the pass it is gone."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    positions = torch.arange(q.shape[2], device=q.device)
    allowed = positions[None, :] <= positions[:, None]
    if sliding_window:
        allowed &= positions[None, :] > positions[:, None] - sliding_window
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1).to(v.dtype)
    return torch.matmul(probs, v).transpose(1, 2).contiguous()


@attention.register_fake
def _attention_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, sliding_window: int,
                     softcap: float) -> torch.Tensor:
    return q.new_empty(q.shape[0], q.shape[2], q.shape[1], v.shape[3])


def _hf_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                  sliding_window: int | None = None, softcap: float | None = None,
                  **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Transformers' attention-interface signature, routed to the one op the pass recognises."""
    if not getattr(module, "is_causal", True):
        raise ValueError(f"autodeploy: {type(module).__name__} is not causal attention")
    scale = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
    out = torch.ops.autodeploy.attention(query, key, value, scale, int(sliding_window or 0), float(softcap or 0.0))
    return out, None


def register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_IMPL, _hf_attention)


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get meta parameters but real buffers (rotary tables, scales)."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    nn.Module.register_parameter = register  # type: ignore[method-assign,assignment]  # undone below
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


@dataclass
class CapturedModel:
    """The exported graph split in two: `body` (input_ids [1, T], position_ids [1, T]) -> final
    hidden states [1, T, hidden]; `head` (hidden [1, N, hidden]) -> logits, with whatever the
    model does after its LM head (soft-capping, scaling). `aliases` maps each name of a tensor
    shared under several names (tied embeddings) to all of them."""

    body: fx.GraphModule
    head: fx.GraphModule
    aliases: dict[str, list[str]] = field(default_factory=dict)
    renamings: list[Any] = field(default_factory=list)  # Transformers' WeightRenaming of older checkpoints

    def parameter_name(self, checkpoint_name: str) -> str:
        """The model's name for a checkpoint tensor (e.g. GPT-NeoX's embed_out -> lm_head)."""
        for renaming in self.renamings:
            checkpoint_name = renaming.rename_source_key(checkpoint_name)[0]
        return checkpoint_name


def build_meta_model(hf_config: PretrainedConfig, dtype: torch.dtype) -> nn.Module:
    """Transformers' own model class for this config, weights on the meta device."""
    from transformers import AutoModelForCausalLM

    register_attention()
    config = hf_config.__class__.from_dict(hf_config.to_dict())
    config.use_cache = False
    with parameters_on_meta(), torch.device("cpu"):
        model: nn.Module = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]  # untyped in transformers
            config, dtype=dtype, attn_implementation=ATTENTION_IMPL)
    return model.eval()


def capture(hf_config: PretrainedConfig, dtype: torch.dtype) -> CapturedModel:
    """Export the model's forward (token dimension dynamic) and split it at the LM head. Export
    runs all on the meta device (inputs too, so no op mixes devices); the buffers' real values,
    computed at build, are put back into the graph module afterwards."""
    model = build_meta_model(hf_config, dtype)
    buffers = dict(model.named_buffers())
    model.to("meta")
    tokens = torch.export.Dim("tokens", min=1, max=1 << 20)
    ids = torch.zeros(1, _EXPORT_TOKENS, dtype=torch.long, device="meta")
    positions = torch.arange(_EXPORT_TOKENS, device="meta").unsqueeze(0)
    try:
        exported = torch.export.export(model, (), {"input_ids": ids, "position_ids": positions},
                                       dynamic_shapes={"input_ids": {1: tokens}, "position_ids": {1: tokens}},
                                       strict=False)
    except Exception as exc:  # export errors are long; name the model and keep the cause
        raise ValueError(f"autodeploy: torch.export could not capture {type(model).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
    graph_module = exported.module()
    assert isinstance(graph_module, fx.GraphModule)
    for name, value in buffers.items():
        owner, _, leaf = name.rpartition(".")
        module = graph_module.get_submodule(owner) if owner else graph_module
        if hasattr(module, leaf):
            setattr(module, leaf, value)
    body, head = split_at_head(plain_graph_module(graph_module))
    return CapturedModel(body, head, _tied_names(model), _renamings(model))


def plain_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A plain GraphModule over the same graph: positional inputs and the logits as the one
    output, instead of export's pytree specs, input-checking hooks and guard module."""
    graph = gm.graph
    graph._codegen = fx.graph.CodeGen()
    for node in list(graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn":
            graph.erase_node(node)
    output = next(n for n in graph.nodes if n.op == "output")
    logits: list[fx.Node] = []
    fx.node.map_arg(output.args[0], logits.append)
    if len(logits) != 1:
        raise ValueError(f"autodeploy: expected the model to return only logits, got {len(logits)} tensors")
    output.args = (logits[0],)
    return fx.GraphModule(gm, graph)


def _renamings(model: nn.Module) -> list[Any]:
    """Transformers' renamings from older checkpoint names; its other conversions (tensors
    fused or split at load) are not applied, so such checkpoints fail with the tensor named."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming

    return [t for t in get_model_conversion_mapping(model) if type(t) is WeightRenaming]  # type: ignore[arg-type]  # a PreTrainedModel


def _tied_names(model: nn.Module) -> dict[str, list[str]]:
    """{name: every name of that tensor} for parameters shared under several names (tied
    embeddings); the checkpoint may hold any one of them."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return {name: names for names in groups.values() if len(names) > 1 for name in names}


def _head_linear(gm: fx.GraphModule) -> fx.Node:
    """The linear producing the logits: walk back from the output through one-input ops."""
    node = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    while isinstance(node, fx.Node) and node.target is not torch.ops.aten.linear.default:
        inputs = [a for a in node.all_input_nodes if a.op != "get_attr"]
        if node.op != "call_function" or len(inputs) != 1:
            raise ValueError(f"autodeploy: cannot find the LM head (stopped at node {node.name!r}, {node.target})")
        node = inputs[0]
    assert isinstance(node, fx.Node)
    return node


_PASS_THROUGH = (torch.ops.aten.alias.default, torch.ops.aten.slice.Tensor)  # logits_to_keep's slice: all rows


def split_at_head(gm: fx.GraphModule) -> tuple[fx.GraphModule, fx.GraphModule]:
    """(body, head): body returns the LM head's input, head maps it to the logits."""
    head_linear = _head_linear(gm)
    hidden = head_linear.args[0]
    while isinstance(hidden, fx.Node) and hidden.target in _PASS_THROUGH:
        hidden = hidden.args[0]
    assert isinstance(hidden, fx.Node)
    head_graph = fx.Graph()
    placeholder = head_graph.placeholder("hidden")
    placeholder.meta = dict(head_linear.args[0].meta)  # type: ignore[union-attr]  # a node: the linear's input
    env: dict[fx.Node, fx.Node] = {head_linear.args[0]: placeholder}  # type: ignore[dict-item]

    def copy_arg(node: fx.Node) -> fx.Node:
        if node not in env:
            if node.op != "get_attr":
                raise ValueError(f"autodeploy: the LM head reads node {node.name!r} ({node.target}) from the body")
            env[node] = head_graph.get_attr(str(node.target))
        return env[node]

    in_head = {head_linear}
    for node in gm.graph.nodes:
        if node.op == "output":
            head_graph.output(env[node.args[0]])
        elif node in in_head or any(a in in_head for a in node.all_input_nodes):
            in_head.add(node)
            env[node] = head_graph.node_copy(node, copy_arg)
    head = fx.GraphModule(gm, head_graph)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    output.args = (hidden,)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm, head


def clean_graph(gm: fx.GraphModule, device: torch.device) -> None:
    """Drop export's tensor-metadata asserts and point device arguments (meta at capture) at
    `device`."""
    for node in list(gm.graph.nodes):
        if node.target is torch.ops.aten._assert_tensor_metadata.default:
            gm.graph.erase_node(node)
            continue
        node.args = fx.node.map_aggregate(node.args, lambda a: device if isinstance(a, torch.device) else a)
        node.kwargs = fx.node.map_aggregate(node.kwargs, lambda a: device if isinstance(a, torch.device) else a)
    gm.graph.eliminate_dead_code()
    gm.recompile()

