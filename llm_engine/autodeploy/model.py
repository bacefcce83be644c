"""AutoDeployedCausalLM: a captured, transformed Transformers model behind the interface the
model runner expects from a registered model (forward -> hidden, compute_logits, load_weights)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import fx, nn

from llm_engine.autodeploy.capture import capture, clean_graph
from llm_engine.autodeploy.passes import PassContext, run_passes
from llm_engine.autodeploy.passes.flatten import flatten_batch
from llm_engine.autodeploy.passes.sharding import shard_lm_head
from llm_engine.layers.attention import AttentionBackend

if TYPE_CHECKING:
    from transformers import PretrainedConfig

logger = logging.getLogger(__name__)


class AutoDeployedCausalLM(nn.Module):
    """Built like the hand-written models: `(hf_config, backend, dtype)` under the target device."""

    sliding_window = True  # windowed layers attend within their window (the engine need not cap lengths)

    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        device = torch.empty(0).device  # the runner builds models under `with torch.device(...)`
        captured = capture(config, dtype)
        for graph in (captured.body, captured.head):
            clean_graph(graph, device)
        context = PassContext(backend, dtype, device, config.get_text_config().max_position_embeddings)
        self.report = run_passes(captured.body, context)
        self.report += [f"head {line}" for line in run_passes(captured.head, context, [flatten_batch, shard_lm_head])]
        captured.body.delete_all_unused_submodules()  # the projections merged away: no second copy of their weights
        for line in self.report:
            logger.info("autodeploy: %s", line)
        self.body: fx.GraphModule = captured.body
        self.head: fx.GraphModule = captured.head
        self.packed_modules = context.packed_modules
        self._aliases = captured.aliases
        self._parameter_name = captured.parameter_name
        self._weight_map = context.weight_map
        self._offsets = context.weight_offsets
        _materialize(self, device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: object) -> torch.Tensor:
        hidden: torch.Tensor = self.body(input_ids, positions, metadata)  # flatten_batch: no batch dimension
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(hidden)
        return logits

    def _targets(self, name: str) -> list[tuple[str, int | None]]:
        """Where a checkpoint tensor goes: a fused parameter's shard, or the parameter of that
        name (every name of a tied tensor) in the body or head."""
        targets: list[tuple[str, int | None]] = []
        for alias in self._aliases.get(name, [name]):
            if alias in self._weight_map:
                path, shard = self._weight_map[alias]
                targets.append((f"body.{path}", shard))
            targets.extend((f"{part}.{alias}", None) for part in ("body", "head"))
        return targets

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors in; raise if a graph parameter was not provided."""
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        for name, tensor in weights:
            if name.endswith("rotary_emb.inv_freq"):
                continue
            found = [(path, shard) for path, shard in self._targets(self._parameter_name(name)) if path in params]
            if not found:
                raise ValueError(f"model: checkpoint tensor {name!r} has no matching parameter")
            for path, shard in found:
                param = params[path]
                loader = getattr(param, "weight_loader", None)
                if shard is not None:
                    assert loader is not None  # fused layers carry one
                    loader(param, tensor, shard)
                elif loader is not None:
                    loader(param, tensor)
                else:
                    if param.shape != tensor.shape:
                        raise ValueError(f"model: {name!r} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}")
                    param.data.copy_(tensor)
                loaded.add(path)
        for path, offset in self._offsets.items():
            params[f"body.{path}"].data.add_(offset)
        shared = {id(p) for path, p in params.items() if path in loaded}
        missing = sorted(path for path, p in params.items() if id(p) not in shared)
        if missing:
            raise ValueError(f"model: checkpoint lacks weights for {missing[:5]}")


def _materialize(model: nn.Module, device: torch.device) -> None:
    """Give meta parameters real (uninitialised) storage; tied ones stay one tensor."""
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or param.device.type != "meta":
                continue
            if id(param) not in made:
                fresh = nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device=device), requires_grad=False)
                for attr, value in vars(param).items():  # weight_loader and friends
                    setattr(fresh, attr, value)
                made[id(param)] = fresh
            module._parameters[name] = made[id(param)]
