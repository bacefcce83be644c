"""Graph passes from a captured Transformers graph to the engine's layers, in order.

Each pass takes the body GraphModule and a `PassContext`, rewrites the graph in place and
returns one line for the build report. Passes that move weights record where each checkpoint
tensor now goes (`weight_map`), so the loader never needs to know which fusions ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import fx

from llm_engine.layers.attention import AttentionBackend


@dataclass
class PassContext:
    backend: AttentionBackend
    dtype: torch.dtype
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where tables computed at build go
    max_positions: int = 0  # rotary tables cover positions [0, max_positions); 0: rotary stays unfused
    weight_map: dict[str, tuple[str, int]] = field(default_factory=dict)  # checkpoint name -> (param, shard)
    weight_offsets: dict[str, float] = field(default_factory=dict)  # param -> constant added at load (Gemma norms)
    packed_modules: dict[str, tuple[str, int]] = field(default_factory=dict)  # for quantization targets


Pass = Callable[[fx.GraphModule, PassContext], str]


def default_passes() -> list[Pass]:
    from llm_engine.autodeploy.passes.activation import fuse_silu_and_mul
    from llm_engine.autodeploy.passes.attention import replace_attention
    from llm_engine.autodeploy.passes.check import check_supported
    from llm_engine.autodeploy.passes.cleanup import drop_noop_casts
    from llm_engine.autodeploy.passes.flatten import flatten_batch
    from llm_engine.autodeploy.passes.layout import tokens_first_attention
    from llm_engine.autodeploy.passes.linear import merge_sibling_linears, split_merged_outputs, swap_linears
    from llm_engine.autodeploy.passes.norm import fuse_add_norm, fuse_layer_norm, fuse_rms_norm
    from llm_engine.autodeploy.passes.rotary import fuse_rotary
    from llm_engine.autodeploy.passes.sharding import shard_tensor_parallel

    # fuse_rotary after the linear and norm passes: it checks which tensors it may rotate in place;
    # flatten_batch after the fusions: it changes the graph's input and output ranks ([1, T] -> [T]);
    # shard_tensor_parallel on the final graph: it reads the blocks between linears as the engine runs them
    return [replace_attention, drop_noop_casts, fuse_rms_norm, fuse_layer_norm, fuse_add_norm,
            merge_sibling_linears, swap_linears, fuse_silu_and_mul, fuse_rotary, tokens_first_attention,
            split_merged_outputs, flatten_batch, shard_tensor_parallel, check_supported]


def run_passes(gm: fx.GraphModule, ctx: PassContext, passes: list[Pass] | None = None) -> list[str]:
    """Run `passes` (the default pipeline) in order; returns the report, one line per pass."""
    report = []
    for graph_pass in passes if passes is not None else default_passes():
        summary = graph_pass(gm, ctx)
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
        report.append(f"{graph_pass.__name__}: {summary}")
    return report


def add_module(gm: fx.GraphModule, path: str, module: torch.nn.Module) -> None:
    """Put `module` at `path`, replacing the plain module that held the weights there."""
    if not gm.add_submodule(path, module):
        raise ValueError(f"autodeploy: cannot place a module at {path!r}")


def fake(node: fx.Node) -> torch.Tensor:
    """The fake tensor export recorded for `node` (shape, dtype)."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"autodeploy: node {node.name!r} ({node.target}) has no recorded tensor shape")
    return value
