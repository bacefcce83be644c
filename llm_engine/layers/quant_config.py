"""Which QuantMethod each linear layer gets.

`EngineConfig.quantization` is one of:
  "auto"        the checkpoint's own format: a GGUF file's Q4_0/Q4_1/Q8_0/Q4_K/Q6_K tensors stay quantized,
                a float checkpoint stays float;
  None          float weights everywhere (GGUF tensors dequantized);
  "gguf"        as "auto", but the model must be a GGUF file;
  "int8"/"int4" every linear layer rounded to nearest at load (int8 per channel, int4 g128 asym);
  "fp8"         float8 E4M3 weights, a scale per output channel;
  "w8a8"        int8 weights per channel, each token's activations rounded to int8 at run time;
  "w4a8"        int4 g32 asym weights, activations rounded to int8 per 32 inputs;
  "awq"/"gptq"  the checkpoint must be one (config.json's quantization_config); "auto" loads those,
                and vLLM's fp8 checkpoints, the same way (loader/quantized_checkpoint.py), kept packed;
  a dict, or a path to a YAML/JSON file holding one, in compressed-tensors' shape:
      config_groups:
        attention: {targets: ["re:.*self_attn.*"], method: int8}
        mlp: {targets: ["re:.*mlp.*"], method: int4, group_size: 32, symmetric: false}
      ignore: ["re:model.layers.0.mlp.*"]
    or one scheme for all linear layers: {method: int4, group_size: 64}; fp8 also takes
    strategy: tensor (one scale for the matrix) or channel (the default).
A target is "Linear" (every linear layer of the decoder), "Embedding" (the token embedding),
"re:<regex>" (full match) or a module name or suffix ("down_proj", "model.layers.3.mlp",
"lm_head"), matched against the engine's module names and the checkpoint's (a fused qkv_proj also
answers to q_proj, k_proj and v_proj). The first group that matches wins; ignored layers stay
float. The token embedding and the LM head stay float unless a group targets them ("Embedding",
"lm_head" or a pattern matching their names): llama.cpp's Q4 files store them quantized, and they
are a fifth of a 1B model's weights. A quantized embedding widens only the rows it looks up; a
tied LM head shares the embedding's table, so the embedding's group decides for both.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from torch import nn

from llm_engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from llm_engine.layers.linear import LinearBase
from llm_engine.layers.quantization import QuantScheme, WeightOnlyLinearMethod
from llm_engine.layers.quantization_formats import CheckpointQuant

logger = logging.getLogger(__name__)

METHODS = ("int8", "int4", "fp8", "w8a8", "w4a8")
CHECKPOINT_METHODS = ("awq", "gptq")  # only ever read from a checkpoint quantized by those tools
MODES = ("auto", "gguf", *CHECKPOINT_METHODS, *METHODS)
_DEFAULT_SCHEMES = {"int8": QuantScheme("int8"), "int4": QuantScheme("int4", 128, symmetric=False),
                    "fp8": QuantScheme("fp8"), "w8a8": QuantScheme("w8a8"),
                    "w4a8": QuantScheme("w4a8", 32, symmetric=False)}
# GGUF block types kept quantized, as the kernel layout they repack into (32-weight blocks).
GGUF_SCHEMES = {"Q4_0": QuantScheme("int4", 32, symmetric=True), "Q4_1": QuantScheme("int4", 32, symmetric=False),
                "Q8_0": QuantScheme("int8", 32), "Q4_K": QuantScheme("int4", 32, symmetric=False),
                "Q6_K": QuantScheme("int8", 16)}
_SCHEME_KEYS = {"targets", "method", "group_size", "symmetric", "strategy"}


def _scheme(entry: dict[str, Any], where: str) -> QuantScheme:
    unknown = set(entry) - _SCHEME_KEYS
    if unknown:
        raise ValueError(f"quantization: {where} has unknown keys {sorted(unknown)}")
    method = entry.get("method")
    if method in CHECKPOINT_METHODS:
        raise ValueError(f"quantization: {method!r} ({where}) is read from a checkpoint quantized by {method.upper()}, "
                         f"not set per layer; load such a checkpoint with quantization={method!r} or 'auto'")
    if method not in METHODS:
        raise ValueError(f"quantization: {where} needs a method in {METHODS}, got {method!r}")
    base = _DEFAULT_SCHEMES[method]
    group = entry.get("group_size", base.group_size)
    if group is not None and (not isinstance(group, int) or isinstance(group, bool) or group < 2 or group % 2):
        raise ValueError(f"quantization: {where} group_size must be a positive even integer, got {group!r}")
    if base.weights == "int4" and group is None:
        raise ValueError(f"quantization: {where} {method} is group-wise; give a group_size (32, 64 or 128)")
    symmetric = entry.get("symmetric", base.symmetric)
    if not isinstance(symmetric, bool):
        raise ValueError(f"quantization: {where} symmetric must be true or false, got {symmetric!r}")
    if base.weights != "int4" and not symmetric:
        raise ValueError(f"quantization: {where} {method} is symmetric only")
    strategy = entry.get("strategy", "channel")
    if strategy not in ("channel", "tensor") or (strategy == "tensor" and method != "fp8"):
        raise ValueError(f"quantization: {where} strategy must be 'channel', or 'tensor' for fp8, got {strategy!r}")
    if strategy == "tensor" and group is not None:
        raise ValueError(f"quantization: {where} a per-tensor scale takes no group_size")
    return QuantScheme(method, group, symmetric, per_tensor=strategy == "tensor")


def _targets(value: object, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise ValueError(f"quantization: {where} must be a list of module names or patterns, got {value!r}")
    for target in value:
        if target.startswith("re:"):
            try:
                re.compile(target[3:])
            except re.error as exc:
                raise ValueError(f"quantization: bad pattern {target!r} in {where}: {exc}") from exc
    return value


class QuantConfig:
    """A validated per-layer plan: ordered (targets, scheme) groups and an ignore list."""

    def __init__(self, groups: list[tuple[list[str], QuantScheme]], ignore: list[str]) -> None:
        self.groups, self.ignore = groups, ignore

    @classmethod
    def parse(cls, value: object) -> QuantConfig:
        """A method name, a dict, or a YAML/JSON file's path (anything else is refused)."""
        if isinstance(value, str):
            if value in METHODS:
                return cls([(["Linear"], _DEFAULT_SCHEMES[value])], [])
            value = _read_file(value)
        if not isinstance(value, dict):
            raise ValueError(f"quantization: expected a method name, a dict or a YAML/JSON file, got {value!r}")
        unknown = set(value) - {"config_groups", "ignore"} - _SCHEME_KEYS
        if unknown:
            raise ValueError(f"quantization: unknown keys {sorted(unknown)}")
        ignore = _targets(value.get("ignore", []), "ignore")
        if "config_groups" not in value:
            single = {k: v for k, v in value.items() if k != "ignore"}
            return cls([(_targets(single.pop("targets", ["Linear"]), "targets"), _scheme(single, "the config"))],
                       ignore)
        groups_value = value["config_groups"]
        if not isinstance(groups_value, dict) or not groups_value:
            raise ValueError("quantization: config_groups must map group names to schemes")
        groups = []
        for name, entry in groups_value.items():
            if not isinstance(entry, dict) or "targets" not in entry:
                raise ValueError(f"quantization: config group {name!r} needs targets and a method")
            groups.append((_targets(entry["targets"], f"group {name!r} targets"),
                           _scheme(entry, f"group {name!r}")))
        return cls(groups, ignore)

    def scheme_for(self, names: list[str], kind: str | None = "Linear") -> QuantScheme | None:
        """The first group's scheme that targets `kind` (the module's class as compressed-tensors
        names it: "Linear", "Embedding"; None for the LM head) or one of `names`."""
        if any(_matches(t, n) for t in self.ignore for n in names):
            return None
        for targets, scheme in self.groups:
            if any(t == kind or _matches(t, n) for t in targets for n in names):
                return scheme
        return None


def _matches(target: str, name: str) -> bool:
    if target.startswith("re:"):
        return re.fullmatch(target[3:], name) is not None
    return name == target or name.endswith("." + target) or name.startswith(target + ".")


def _read_file(path: str) -> object:
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"quantization: {path!r} is neither a method {MODES} nor a config file")
    text = file.read_text()
    if file.suffix == ".json":
        loaded: object = json.loads(text)
        return loaded
    import yaml

    loaded = yaml.safe_load(text)
    return loaded


def validate(value: object) -> None:
    """Fail at config time on a malformed quantization setting (EngineConfig calls this)."""
    if value is None or value in ("auto", "gguf", *CHECKPOINT_METHODS):
        return
    QuantConfig.parse(value)


def checkpoint_names(model: nn.Module, name: str) -> list[str]:
    """A linear module's own name and the checkpoint names of the projections fused into it."""
    prefix, _, leaf = name.rpartition(".")
    parts = [source for source, (target, _) in getattr(model, "packed_modules", {}).items() if target == leaf]
    return [name, *(f"{prefix}.{part}" for part in parts)]


def assign_quantization(model: nn.Module, value: object, gguf_types: dict[str, str] | None,
                        checkpoint: CheckpointQuant | None = None) -> tuple[dict[str, str], set[str]]:
    """Give every linear layer of `model` (built, not yet loaded) its QuantMethod.

    Returns the effective map {module name: scheme or "float"} and the checkpoint weights to load
    still quantized (GGUF tensors whose block type the layer keeps)."""
    if checkpoint is not None:
        return _assign_checkpoint(model, value, checkpoint), set()
    if value in CHECKPOINT_METHODS:
        raise ValueError(f"quantization: {value!r} needs a checkpoint whose config.json has a quantization_config "
                         f"with quant_method {value!r}")
    if value == "gguf" and gguf_types is None:
        raise ValueError("quantization: 'gguf' needs a .gguf model file")
    kept_types = gguf_types if value in ("auto", "gguf") else None  # GGUF block types that stay quantized
    config = None if value in (None, "auto", "gguf") else QuantConfig.parse(value)
    effective: dict[str, str] = {}
    keep: set[str] = set()
    if kept_types is not None:
        _keep_gguf_tables(model, kept_types, effective, keep)
    elif config is not None:
        _quantize_tables(model, config, effective)
    for name, module in model.named_modules():
        if not isinstance(module, LinearBase):
            continue
        names = checkpoint_names(model, name)
        parts = names[1:] or names
        if kept_types is not None:
            types = {kept_types.get(f"{part}.weight", "F32") for part in parts}
            scheme = GGUF_SCHEMES.get(next(iter(types))) if len(types) == 1 else None
            if scheme is None:
                logger.info("quantization: %s is GGUF %s, dequantized to float (kept quantized: %s)",
                            name, "/".join(sorted(types)), ", ".join(GGUF_SCHEMES))
                effective[name] = "float"
                continue
            module.set_quant_method(WeightOnlyLinearMethod(scheme, prequantized=True))
            keep.update(f"{part}.weight" for part in parts)
            effective[name] = f"gguf {next(iter(types))} -> {scheme.describe()}"
            continue
        scheme = config.scheme_for(names) if config is not None else None
        if scheme is None:
            effective[name] = "float"
            continue
        module.set_quant_method(WeightOnlyLinearMethod(scheme))
        effective[name] = scheme.describe()
    return effective, keep


def _assign_checkpoint(model: nn.Module, value: object, checkpoint: CheckpointQuant) -> dict[str, str]:
    """Layers the checkpoint stores quantized keep its tensors (repacked); the rest stay float."""
    if value not in ("auto", checkpoint.method):
        raise ValueError(f"quantization: the checkpoint is already quantized ({checkpoint.describe()}); "
                         f"load it with quantization='auto' or {checkpoint.method!r}, not {value!r}")
    effective: dict[str, str] = {}
    for name, module in model.named_modules():
        if not isinstance(module, LinearBase):
            continue
        parts = checkpoint_names(model, name)[1:] or [name]
        stored = {part in checkpoint.modules for part in parts}
        if stored == {False}:
            effective[name] = "float"
            continue
        if stored != {True}:
            raise ValueError(f"quantization: {name} fuses {parts}, which the checkpoint stores partly quantized")
        quants = {checkpoint.for_module(part) for part in parts}
        if len(quants) > 1:
            raise ValueError(f"quantization: {name} fuses {parts}, which the checkpoint stores with different bits "
                             f"or group sizes")
        quant = quants.pop()
        module.set_quant_method(WeightOnlyLinearMethod(quant.scheme, prequantized=True, act_order=quant.act_order))
        effective[name] = f"{quant.describe()} -> {quant.scheme.describe()}"
    _checkpoint_tables(model, checkpoint, effective)
    return effective


def _language_models(model: nn.Module) -> Iterator[tuple[str, VocabParallelEmbedding, ParallelLMHead, bool]]:
    """Each causal LM in `model` (a vision-language model wraps one): its names' prefix ("" or
    "language_model."), token embedding, LM head, and whether the two are tied."""
    for prefix, owner in model.named_modules():
        head = getattr(owner, "lm_head", None)
        if isinstance(head, ParallelLMHead):
            embedding = cast(VocabParallelEmbedding, owner.get_submodule("model.embed_tokens"))
            yield f"{prefix}." if prefix else "", embedding, head, bool(getattr(owner, "tied", False))


def _checkpoint_tables(model: nn.Module, checkpoint: CheckpointQuant, effective: dict[str, str]) -> None:
    """A token embedding or untied LM head the checkpoint stores quantized (as `codeyard llm
    quantize` writes them) stays packed; a tied head shares the embedding's table."""
    for dot, embedding, head, tied in _language_models(model):
        for table, name in ((embedding, f"{dot}model.embed_tokens"), (None if tied else head, f"{dot}lm_head")):
            if table is None or name not in checkpoint.modules:
                continue
            quant = checkpoint.for_module(name)
            if quant.act_order:
                raise ValueError(f"quantization: {name} is stored with act-order (desc_act), which a table cannot take")
            table.set_quant_method(WeightOnlyLinearMethod(quant.scheme, prequantized=True))
            effective[name] = f"{quant.describe()} -> {quant.scheme.describe()}"
        if tied and embedding.quant_method is not None:
            head.tie(embedding)
            effective[f"{dot}lm_head"] = f"tied to {dot}model.embed_tokens"


def _keep_gguf_tables(model: nn.Module, gguf_types: dict[str, str], effective: dict[str, str],
                      keep: set[str]) -> None:
    """The token embedding and LM head stay quantized too (a tied head shares the embedding's)."""
    for name, module in model.named_modules():
        if not isinstance(module, VocabParallelEmbedding):
            continue
        tied_head = module if isinstance(module, ParallelLMHead) and getattr(model, "tied", False) else None
        kind = gguf_types.get("model.embed_tokens.weight" if tied_head else f"{name}.weight", "F32")
        scheme = GGUF_SCHEMES.get(kind)
        if scheme is None:
            effective[name] = "float"
        elif tied_head is not None:
            # the decoder's token embedding, a VocabParallelEmbedding in every model the engine builds
            tied_head.tie(cast(VocabParallelEmbedding, model.get_submodule("model.embed_tokens")))
            effective[name] = "tied to model.embed_tokens"
        else:
            module.set_quant_method(WeightOnlyLinearMethod(scheme, prequantized=True))
            keep.add(f"{name}.weight")
            effective[name] = f"gguf {kind} -> {scheme.describe()}"


def _quantize_tables(model: nn.Module, config: QuantConfig, effective: dict[str, str]) -> None:
    """The token embedding and LM head of each causal LM in `model` (a vision-language model
    wraps one), rounded at load where the config targets them; a tied head shares the table."""
    for dot, embedding, head, tied in _language_models(model):
        names = {"embedding": f"{dot}model.embed_tokens", "head": f"{dot}lm_head"}
        scheme = config.scheme_for([names["embedding"]], "Embedding")
        head_scheme = config.scheme_for([names["head"]], None)
        if scheme is not None:
            embedding.set_quant_method(WeightOnlyLinearMethod(scheme))
        effective[names["embedding"]] = "float" if scheme is None else scheme.describe()
        if not tied:
            if head_scheme is not None:
                head.set_quant_method(WeightOnlyLinearMethod(head_scheme))
            effective[names["head"]] = "float" if head_scheme is None else head_scheme.describe()
            continue
        if head_scheme is not None and head_scheme != scheme:
            raise ValueError(f"quantization: {names['head']} is tied to {names['embedding']} (tie_word_embeddings), "
                             f"so it shares the embedding's table: target the embedding ('Embedding') with "
                             f"{head_scheme.describe()} instead")
        if scheme is not None:
            head.tie(embedding)
        effective[names["head"]] = "float" if scheme is None else f"tied to {names['embedding']}"


def summarize(effective: dict[str, str]) -> str:
    """'int4 g32 asym x 90, float x 30': the map in one log line."""
    counts: dict[str, int] = {}
    for description in effective.values():
        counts[description] = counts.get(description, 0) + 1
    return ", ".join(f"{d} x {n}" for d, n in counts.items())
