"""`codeyard llm quantize`: write a quantized copy of a local Hugging Face checkpoint, in layouts
other tools read too (the engine loads them through loader/quantized_checkpoint.py):

  int8  GPTQ's layout, 8 bits, symmetric, per output channel unless a group size is given;
  int4  GPTQ's layout, 4 bits with zero points, groups of 128 by default (64 or 32 where the
        input sizes need it; groups are whole, as vLLM and AutoAWQ require);
  gptq  GPTQ's layout, 4 bits with zero points, groups of 128, rounded by GPTQ's error-compensating
        algorithm over calibration text (layers/quantization_gptq.py, calibration.py). Not symmetric
        (AutoGPTQ's default): on SmolLM2 at g64 symmetric GPTQ kept 75% of round-to-nearest's
        perplexity cost (with zero points), with zero points 51%;
  awq   AWQ's GEMM layout, 4 bits with zero points, groups of 128, columns scaled by AWQ's
        activation-aware search over calibration text first (layers/quantization_awq.py);
  fp8   vLLM's fp8 form: float8 E4M3 weights, one float32 scale per matrix.

Every 2-D weight inside the decoder layers is quantized (int8, int4 and fp8 round to nearest,
no calibration); norms are copied as they are. GPTQ's zero points are written in its v1 form (z - 1),
so a zero point is at least 1.

The token embedding and LM head tables (`--tables`, int8 by default for the GPTQ-layout methods)
are written in GPTQ's layout too, 8 bits per vocabulary row, symmetric: on a ~1B model with a 49k
vocabulary they are a fifth of the weights, and float tables kept int4 at 0.43x of bf16's memory
(the goal is 0.35x). Why int8 and not the layers' int4: int4 tables cost SmolLM2 +5% perplexity,
int8 ones +0.4%. Where that differs from the checkpoint's bits or groups, quantization_config says
so in GPTQModel's `dynamic` overrides (which vLLM reads too), and `lm_head: true` marks a quantized
head (GPTQModel's and vLLM's key). AWQ and fp8 checkpoints have no 8-bit per-row layout: their
tables stay float. Tools that do not quantize embeddings (vLLM keeps them float) need
`--tables float`.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from llm_engine.calibration import calibration_batches, default_calibration_files, input_moments
from llm_engine.layers.quantization import quantize_fp8
from llm_engine.layers.quantization_awq import search_scales
from llm_engine.layers.quantization_formats import awq_pack, pack_int32, quantize_rtn
from llm_engine.layers.quantization_gptq import gptq_quantize
from llm_engine.loader.safetensors_weights import safetensors_files


@dataclass(frozen=True)
class Recipe:
    """What one --method writes: the checkpoint format, bits, default group (None: per channel), symmetry."""

    quant_method: str
    bits: int
    group_size: int | None
    symmetric: bool
    calibrated: bool = False


TABLE_CHOICES = ("int8", "float")
_TABLE_RECIPE = Recipe("gptq", 8, None, True)  # one scale per vocabulary row
RECIPES = {"int8": Recipe("gptq", 8, None, True), "int4": Recipe("gptq", 4, 128, False),
           "gptq": Recipe("gptq", 4, 128, False, calibrated=True), "awq": Recipe("awq", 4, 128, False, calibrated=True),
           "fp8": Recipe("fp8", 8, None, True)}
_COPIED = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
           "merges.txt", "generation_config.json", "added_tokens.json", "chat_template.jinja")


def quantize_checkpoint(source: Path, out: Path, method: str, group_size: int | None = None,
                        calibration: list[Path] | None = None,
                        progress: Callable[[str], None] = print, tables: str | None = None,
                        partial_groups: bool = False) -> dict[str, Any]:
    """Quantize the checkpoint in `source` into `out` (created, must not hold files); returns the
    quantization_config written. `calibration`: text files for gptq/awq (default: standard
    library sources); `tables`: "int8" or "float" (default: int8 where the layout has it);
    `partial_groups`: let a group size that does not divide the inputs end in a shorter group
    (the engine loads that, vLLM and AutoAWQ do not). Raises ValueError on bad input before
    writing anything."""
    if method not in RECIPES:
        raise ValueError(f"quantize: --method must be one of {', '.join(RECIPES)}, got {method!r}")
    recipe = RECIPES[method]
    tables = tables or ("int8" if recipe.quant_method == "gptq" else "float")
    if tables not in TABLE_CHOICES:
        raise ValueError(f"quantize: --tables must be one of {', '.join(TABLE_CHOICES)}, got {tables!r}")
    if tables == "int8" and recipe.quant_method != "gptq":
        raise ValueError(f"quantize: --tables int8 is written in GPTQ's layout, which {recipe.quant_method} "
                         f"checkpoints do not hold; use --tables float")
    config = _read_config(source)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"quantize: {out} exists and is not an empty folder")
    files = safetensors_files(source)
    if not files:
        raise ValueError(f"quantize: no .safetensors weights in {source}")
    targets = _targets(files)
    group = _group(recipe, method, group_size, [shape[1] for shape in targets.values()])
    table_targets = _table_targets(files) if tables == "int8" else {}
    for name, shape in targets.items():
        _check_shape(name, shape, recipe, None if partial_groups else group)
    for name, shape in table_targets.items():
        try:
            _check_shape(name, shape, _TABLE_RECIPE, None)
        except ValueError as exc:
            raise ValueError(f"{exc} (or keep the tables float: --tables float)") from None
    if calibration and not recipe.calibrated:
        raise ValueError(f"quantize: --calibration is for --method gptq or awq; {method} rounds to nearest")
    moments = _calibrate(source, set(targets), calibration, progress) if recipe.calibrated else {}
    factors = _awq_factors(files, targets, moments, group, progress) if recipe.quant_method == "awq" else {}
    tensors: dict[str, torch.Tensor] = {}
    done = 0
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                tensor = handle.get_tensor(name)
                if name in factors:
                    tensor = (tensor.float() * factors[name]).to(tensor.dtype)
                if name not in targets and name not in table_targets:
                    tensors[name] = tensor
                    continue
                done += 1
                table = name in table_targets
                progress(f"[{done}/{len(targets) + len(table_targets)}] {name.removesuffix('.weight')} "
                         f"{tensor.shape[0]}x{tensor.shape[1]} -> {'int8 per row' if table else method}")
                prefix = name.removesuffix(".weight")
                quantized = (_quantize(tensor, _TABLE_RECIPE, None, None) if table
                             else _quantize(tensor, recipe, group, moments.get(name)))
                for part, value in quantized.items():
                    tensors[f"{prefix}.{part}"] = value
    quant = _quantization_config(recipe, group, [name.removesuffix(".weight") for name in table_targets])
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps({**config, "quantization_config": quant}, indent=2) + "\n")
    for extra in _COPIED:
        if (source / extra).is_file():
            shutil.copy2(source / extra, out / extra)
    return quant


def _read_config(source: Path) -> dict[str, Any]:
    if not source.is_dir() or not (source / "config.json").is_file():
        raise ValueError(f"quantize: {source} is not a Hugging Face model folder (no config.json)")
    try:
        config: dict[str, Any] = json.loads((source / "config.json").read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"quantize: {source / 'config.json'} is not valid JSON ({exc})") from None
    if "quantization_config" in config:
        raise ValueError(f"quantize: {source} is already quantized "
                         f"({config['quantization_config'].get('quant_method', '?')})")
    return config


def _group(recipe: Recipe, method: str, group_size: int | None, input_sizes: list[int]) -> int | None:
    """The group size: as given, or the default (128) halved until it divides every input size
    (vLLM and AutoAWQ load whole groups only; SmolLM2's 576 inputs take 64)."""
    if group_size is None:
        group = recipe.group_size
        while group is not None and group > 32 and any(k % group for k in input_sizes):
            group //= 2
        return group
    if method == "fp8":
        raise ValueError("quantize: fp8 takes no --group-size (one scale per matrix)")
    if group_size == -1:
        return None
    if group_size < 2 or group_size % 2:
        raise ValueError(f"quantize: --group-size must be -1 (per channel) or a positive even number, got {group_size}")
    return group_size


def _matrices(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """{name: shape} of every 2-D weight in the checkpoint (read from the headers)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                shape = tuple(handle.get_slice(name).get_shape())
                if name.endswith(".weight") and len(shape) == 2:
                    shapes[name] = shape
    return shapes


def _targets(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """{name: shape} of the weights to quantize: every 2-D weight inside the decoder layers."""
    targets = {name: shape for name, shape in _matrices(files).items() if ".layers." in name}
    if not targets:
        raise ValueError("quantize: the checkpoint has no decoder-layer linear weights to quantize")
    return targets


def _table_targets(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """{name: shape} of the token embedding and LM head tables (outside the decoder layers)."""
    return {name: shape for name, shape in _matrices(files).items()
            if ".layers." not in name and (name.endswith("embed_tokens.weight")
                                           or name.removesuffix(".weight").rpartition(".")[2] == "lm_head")}


def _check_shape(name: str, shape: tuple[int, ...], recipe: Recipe, group: int | None) -> None:
    n_out, k_in = shape
    per = 32 // recipe.bits
    if recipe.quant_method == "fp8":
        return
    if k_in % per or n_out % per:
        raise ValueError(f"quantize: {name} is {n_out}x{k_in}; {recipe.quant_method} packs {per} values "
                         f"per int32, so both sizes must be multiples of {per}")
    if group is not None and k_in % group:
        raise ValueError(f"quantize: {name} has {k_in} inputs, not a multiple of the group size {group} "
                         f"(--partial-groups ends each row in a shorter group: the engine loads that, vLLM does not)")


def _calibrate(source: Path, names: set[str], files: list[Path] | None,
               progress: Callable[[str], None]) -> dict[str, torch.Tensor]:
    files = files or default_calibration_files()
    batches = calibration_batches(source, files)
    progress(f"calibrating on {sum(b.numel() for b in batches)} tokens")
    moments = input_moments(source, names, batches)
    missing = sorted(names - set(moments))
    if missing:
        raise ValueError(f"quantize: calibration did not reach {missing[0]} (not a linear layer of the model)")
    return moments


def _awq_factors(files: list[Path], targets: dict[str, tuple[int, ...]], moments: dict[str, torch.Tensor],
                 group: int | None, progress: Callable[[str], None]) -> dict[str, torch.Tensor]:
    """AWQ's scales as {tensor name: factor}: the projections reading an input get s on their
    columns, the RMSNorm (or up_proj's rows, for down_proj) that produces it 1/s. Layers not
    named as Llama's are rounded unscaled."""
    where: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            where.update(dict.fromkeys(handle.keys(), file))

    def read(name: str) -> torch.Tensor:
        with safe_open(str(where[name]), framework="pt") as handle:
            tensor: torch.Tensor = handle.get_tensor(name)
        return tensor

    factors: dict[str, torch.Tensor] = {}
    layers = sorted({name.split(".self_attn.")[0] for name in targets if ".self_attn.q_proj." in name})
    for index, layer in enumerate(layers):
        attention, mlp = f"{layer}.self_attn", f"{layer}.mlp"
        for members, producer, rows in (
                ([f"{attention}.{p}_proj.weight" for p in "qkv"], f"{layer}.input_layernorm.weight", False),
                ([f"{mlp}.gate_proj.weight", f"{mlp}.up_proj.weight"], f"{layer}.post_attention_layernorm.weight",
                 False),
                ([f"{mlp}.down_proj.weight"], f"{mlp}.up_proj.weight", True)):
            if not all(m in targets for m in members) or producer not in where:
                continue
            scales = search_scales([read(m) for m in members], moments[members[0]], 4, group)
            for member in members:
                factors[member] = factors.get(member, torch.tensor(1.0)) * scales
            inverse = (1 / scales).unsqueeze(1) if rows else 1 / scales
            factors[producer] = factors.get(producer, torch.tensor(1.0)) * inverse
        progress(f"AWQ scales for layer {index + 1}/{len(layers)}")
    return factors


def _quantize(weight: torch.Tensor, recipe: Recipe, group: int | None,
              moments: torch.Tensor | None) -> dict[str, torch.Tensor]:
    k_in = weight.shape[1]
    if recipe.quant_method == "fp8":
        q, scales = quantize_fp8(weight, k_in, per_tensor=True)
        return {"weight": q, "weight_scale": scales[0, 0].float().clone()}
    group_len = group or k_in
    if recipe.quant_method == "awq":
        codes, zeros, scales = quantize_rtn(weight, 4, group_len, symmetric=False)
        return {"qweight": awq_pack(codes), "qzeros": awq_pack(zeros), "scales": scales}
    if moments is not None:
        codes, zeros, scales, g_idx = gptq_quantize(weight, moments, recipe.bits, group, recipe.symmetric, min_zero=1)
    else:
        codes, zeros, scales = quantize_rtn(weight, recipe.bits, group_len, recipe.symmetric, min_zero=1)
        g_idx = (torch.arange(k_in) // group_len).to(torch.int32)
    return {"qweight": pack_int32(codes, recipe.bits, dim=0), "qzeros": pack_int32(zeros - 1, recipe.bits, dim=1),
            "scales": scales, "g_idx": g_idx}


def _quantization_config(recipe: Recipe, group: int | None, tables: list[str]) -> dict[str, Any]:
    """The config.json entry; `tables`: the modules written as int8 per row."""
    if recipe.quant_method == "fp8":
        return {"quant_method": "fp8", "activation_scheme": "dynamic"}
    config: dict[str, Any] = {"quant_method": recipe.quant_method, "bits": recipe.bits, "group_size": group or -1}
    if recipe.quant_method == "awq":
        return {**config, "zero_point": True, "version": "gemm"}
    config = {**config, "desc_act": False, "sym": recipe.symmetric, "checkpoint_format": "gptq"}
    if tables and (recipe.bits, group, recipe.symmetric) != (8, None, True):
        config["dynamic"] = {f"+:{re.escape(table)}$": {"bits": 8, "group_size": -1, "sym": True, "desc_act": False}
                             for table in tables}
    if any(table.rpartition(".")[2] == "lm_head" for table in tables):
        config["lm_head"] = True
    return config
