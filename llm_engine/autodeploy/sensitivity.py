"""Per-layer quantization sensitivity: which linear layers stay in higher precision.

On local calibration text (Python standard library sources, never a download) the float model's
perplexity is the reference. Each linear layer is scored by its own output error under the scheme
(relative L2 error of the quantized layer on the inputs it saw in the float pass); the layers are
then kept in float, most sensitive first, until the model with every other layer quantized is
within the accuracy budget (relative perplexity increase). The number kept is found by bisection
over that ranking (perplexity grows as fewer are kept), so a model of N layers costs about log2 N
forward passes, not N. Scoring uses the engine's own quantized layers and the built graph, so the
numbers are those of the engine that will run.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from torch import nn

from llm_engine.calibration import default_calibration_files
from llm_engine.layers.attention import Attention, SeqSlice, TorchPagedAttention
from llm_engine.layers.linear import LinearBase
from llm_engine.layers.quant_config import METHODS, QuantConfig
from llm_engine.layers.quantization import WeightOnlyLinearMethod
from llm_engine.tokenizer import Tokenizer

_BLOCK = 16
_ROWS_KEPT = 1024  # calibration rows per layer for its error score
_NAMES_SHOWN = 6  # kept layers named in the report line


@dataclass
class Sensitivity:
    method: str
    budget: float  # allowed relative perplexity increase (0.01 = 1%)
    errors: dict[str, float]  # layer -> relative output error under the scheme
    kept: list[str]  # most sensitive layers, left in float
    perplexity: dict[str, float]  # "float", "all quantized", "chosen"

    def quantization(self) -> dict[str, object]:
        """The per-layer choice as a quantization config (layers/quant_config.py's shape)."""
        return {"method": self.method, "ignore": list(self.kept)}

    def lines(self) -> list[str]:
        ppl = self.perplexity
        worst = sorted(self.errors.items(), key=lambda item: -item[1])[:3]
        return [f"sensitivity ({self.method}, budget {self.budget:.2%} perplexity): float {ppl['float']:.3f}, "
                f"all quantized {ppl['all quantized']:.3f}, chosen {ppl['chosen']:.3f}",
                f"kept in float: {len(self.kept)} of {len(self.errors)} layers {self.kept[:_NAMES_SHOWN]}"
                + (f" and {len(self.kept) - _NAMES_SHOWN} more (all in the manifest)" if len(self.kept) > _NAMES_SHOWN else ""),
                "most sensitive: " + ", ".join(f"{name} {error:.3%}" for name, error in worst)]


def calibration_files(given: list[Path] | None) -> list[Path]:
    """The files given (each must exist), else the default calibration text."""
    files = given or default_calibration_files()
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"--calibration: {missing[0]} is not a file")
    return files


def calibration_tokens(files: list[Path], tokenizer: Tokenizer | None, vocab_size: int,
                       sequences: int, length: int) -> list[list[int]]:
    """`sequences` windows of `length` tokens of the files' text; without a tokenizer (random test
    models) the text's bytes, folded into the vocabulary."""
    text = "\n".join(file.read_text(errors="replace") for file in files)
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"]) if tokenizer is not None else [b % vocab_size for b in text.encode()]
    if len(ids) < sequences * length:
        raise ValueError(f"sensitivity: the calibration text has {len(ids)} tokens, fewer than "
                         f"{sequences} x {length}")
    return [ids[i * length:(i + 1) * length] for i in range(sequences)]


class ScratchRunner:
    """Runs sequences through the built model with a scratch KV pool (the PyTorch backend): the
    sensitivity pass's perplexity and the dtype tuner's decode steps (autodeploy/tune.py)."""

    def __init__(self, model: nn.Module, length: int, sequences: int = 1) -> None:
        self.model, self.backend = model, TorchPagedAttention()
        self.layers = [m for m in model.modules() if isinstance(m, Attention)]
        blocks = -(-length // _BLOCK)
        first = self.layers[0]
        self.caches = [torch.zeros(2, blocks * sequences, first.num_kv_heads, _BLOCK, first.head_dim,
                                   dtype=next(model.parameters()).dtype) for _ in self.layers]
        self.tables = [list(range(s * blocks, (s + 1) * blocks)) for s in range(sequences)]

    def metadata(self, slices: list[SeqSlice]) -> object:
        """The step's attention metadata, with the pool bound to the model's attention layers."""
        for layer, cache in zip(self.layers, self.caches):
            layer.backend, layer.k_cache, layer.v_cache = self.backend, cache[0], cache[1]
        return self.backend.build_metadata(slices, _BLOCK, torch.device("cpu"))

    def release(self) -> None:
        for attention in self.layers:
            attention.k_cache = attention.v_cache = torch.empty(0)

    @torch.inference_mode()
    def nll(self, ids: list[int]) -> tuple[float, int]:
        """(summed negative log-likelihood of each next token, tokens predicted)."""
        metadata = self.metadata([SeqSlice(0, len(ids), self.tables[0])])
        tokens = torch.tensor(ids)
        hidden = self.model(tokens, torch.arange(len(ids)), metadata)
        logits = self.model.compute_logits(hidden[:-1]).float()  # type: ignore[operator]  # AutoDeployedCausalLM
        loss = torch.nn.functional.cross_entropy(logits, tokens[1:], reduction="sum")
        return float(loss), len(ids) - 1

    def perplexity(self, batch: list[list[int]]) -> float:
        totals = [self.nll(ids) for ids in batch]
        return math.exp(sum(t[0] for t in totals) / sum(t[1] for t in totals))


def _quantized_copy(layer: LinearBase, method: str) -> LinearBase:
    """The layer as the scheme would run it (its own copy, the original untouched)."""
    scheme = QuantConfig.parse(method).scheme_for(["Linear"])
    assert scheme is not None
    weight = cast(torch.Tensor, layer.weight).detach().clone()
    quantized = copy.deepcopy(layer)
    quantized.set_quant_method(WeightOnlyLinearMethod(scheme))
    cast(torch.Tensor, quantized.weight).data.copy_(weight)
    quantized.quant_method.process_weights_after_loading(quantized)
    return quantized


def _swap(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent), leaf, module)


def measure_sensitivity(model: nn.Module, method: str, batch: list[list[int]], budget: float) -> Sensitivity:
    """Score every linear layer of the float-loaded `model` and choose those kept in float."""
    if method not in METHODS:
        raise ValueError(f"--accuracy-budget: needs --quantization set to one of {METHODS}, got {method!r}")
    linears = {name: m for name, m in model.named_modules() if isinstance(m, LinearBase)}
    inputs: dict[str, list[torch.Tensor]] = {name: [] for name in linears}
    hooks = [m.register_forward_pre_hook(lambda _, args, name=name: inputs[name].append(args[0].detach().clone()))
             for name, m in linears.items()]
    runner = ScratchRunner(model, max(len(ids) for ids in batch))
    try:
        float_ppl = runner.perplexity(batch)
    finally:
        for hook in hooks:
            hook.remove()
    quantized: dict[str, LinearBase] = {}
    errors: dict[str, float] = {}
    with torch.inference_mode():
        for name, layer in linears.items():
            rows = torch.cat([x.reshape(-1, x.shape[-1]) for x in inputs.pop(name)])[:_ROWS_KEPT]
            quantized[name] = _quantized_copy(layer, method)
            reference = layer(rows).float()
            errors[name] = float((quantized[name](rows).float() - reference).norm() / reference.norm().clamp_min(1e-12))
    ranking = sorted(errors, key=lambda name: -errors[name])

    def perplexity_keeping(count: int) -> float:
        for position, name in enumerate(ranking):
            _swap(model, name, linears[name] if position < count else quantized[name])
        return runner.perplexity(batch)

    limit = float_ppl * (1 + budget)
    kept, chosen = 0, perplexity_keeping(0)
    all_quantized = chosen
    if all_quantized > limit:  # the fewest kept within the budget lies in [low, kept]; all kept is float
        low, kept, chosen = 1, len(ranking), float_ppl
        while low < kept:
            middle = (low + kept) // 2
            ppl = perplexity_keeping(middle)
            if ppl <= limit:
                kept, chosen = middle, ppl
            else:
                low = middle + 1
    for name, layer in linears.items():  # the model leaves as it came: float
        _swap(model, name, layer)
    runner.release()
    return Sensitivity(method, budget, errors, ranking[:kept],
                       {"float": float_ppl, "all quantized": all_quantized, "chosen": chosen})
