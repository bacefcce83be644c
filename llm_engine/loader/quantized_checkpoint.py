"""Checkpoints quantized by other tools: AWQ, GPTQ and fp8 safetensors, read from config.json's
`quantization_config` and repacked tensor by tensor into the engine's layout while streaming
(no float copy of a weight is made).

fp8 is vLLM's serialized form: a float8 E4M3 `weight` with one float32 `weight_scale` per matrix,
activations dynamic (static `input_scale`s are refused).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from llm_engine.layers.quantization_formats import (
    CheckpointQuant,
    act_order_perm,
    awq_unpack,
    to_engine_layout,
    unpack_int32,
)
from llm_engine.loader.safetensors_weights import safetensors_files

# The tensors a quantized module stores, per method (all of them must arrive before it is repacked).
PARTS = {"awq": ("qweight", "qzeros", "scales"), "gptq": ("qweight", "qzeros", "scales", "g_idx"),
         "fp8": ("weight", "weight_scale")}
_MARKER = {"awq": "qweight", "gptq": "qweight", "fp8": "weight_scale"}


def _integer(config: dict[str, Any], key: str, default: int, where: str = "quantization_config") -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"model: {where} {key} must be an integer, got {value!r}")
    return value


def _bits_and_group(config: dict[str, Any], method: str, bits: int, group: int,
                    where: str = "quantization_config") -> tuple[int, int | None]:
    bits, group = _integer(config, "bits", bits, where), _integer(config, "group_size", group, where)
    allowed = (4,) if method == "awq" else (4, 8)
    if bits not in allowed:
        raise ValueError(f"model: {method} with {bits} bits is not supported (bits {allowed})")
    if group != -1 and (group < 2 or group % 2):
        raise ValueError(f"model: {method} group_size must be -1 or a positive even number, got {group}")
    return bits, None if group == -1 else group


def _dynamic(config: dict[str, Any], bits: int, group: int | None) -> tuple[tuple[str, int, int | None], ...]:
    """GPTQModel's per-module overrides, as vLLM reads them: {"+:regex" or "regex": {bits, group_size,
    ...}} quantize the modules they match that way; "-:regex" ones are not quantized (the
    checkpoint then stores them float, which the tensors present already say)."""
    value = config.get("dynamic", {})
    value = {} if value is None else value
    if not isinstance(value, dict):
        raise ValueError(f"model: quantization_config dynamic must map module patterns to overrides, got {value!r}")
    overrides = []
    for key, override in value.items():
        if str(key).startswith("-:"):
            continue
        pattern = str(key).removeprefix("+:")
        where = f"quantization_config dynamic {key!r}"
        if not isinstance(override, dict):
            raise ValueError(f"model: {where} must be a mapping of overrides, got {override!r}")
        if override.get("desc_act"):
            raise ValueError(f"model: {where} turns on desc_act; act-order per module is not supported")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"model: {where} is not a regular expression: {exc}") from None
        overrides.append((pattern, *_bits_and_group(override, "gptq", bits, -1 if group is None else group, where)))
    return tuple(overrides)


def read_checkpoint_quant(hf_config: object, folder: Path) -> CheckpointQuant | None:
    """The checkpoint's quantization from config.json, None for a float checkpoint; a clear
    ValueError for a method or option the engine cannot load."""
    config = getattr(hf_config, "quantization_config", None)
    if config is None:
        return None
    if not isinstance(config, dict):
        config = config.to_dict()
    method = str(config.get("quant_method", "")).lower()
    if method not in PARTS:
        raise ValueError(f"model: quantization_config quant_method {method!r} is not supported "
                         f"(checkpoints load from {sorted(PARTS)})")
    if method == "fp8":
        if config.get("activation_scheme", "dynamic") != "dynamic" or config.get("weight_block_size"):
            raise ValueError("model: fp8 checkpoints load with dynamic activations and one scale per matrix only")
        return CheckpointQuant("fp8", 8, None, modules=_stored_modules(folder, method))
    bits, group = _bits_and_group(config, method, 4, 128 if method == "awq" else -1)
    if method == "awq":
        if config.get("version", "gemm").lower() != "gemm" or config.get("zero_point", True) is not True:
            raise ValueError("model: AWQ loads the GEMM version with zero points only")
        return CheckpointQuant("awq", 4, group, modules=_stored_modules(folder, method))
    checkpoint_format = config.get("checkpoint_format", "gptq")
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise ValueError(f"model: GPTQ checkpoint_format {checkpoint_format!r} is not supported (gptq, gptq_v2)")
    return CheckpointQuant("gptq", bits, group, act_order=bool(config.get("desc_act")),
                           zero_offset=1 if checkpoint_format == "gptq" else 0,
                           modules=_stored_modules(folder, method), dynamic=_dynamic(config, bits, group))


def _stored_modules(folder: Path, method: str) -> frozenset[str]:
    """Names of the modules whose tensors the checkpoint stores quantized (read from the headers)."""
    marker = "." + _MARKER[method]
    names: set[str] = set()
    for file in safetensors_files(folder):
        with safe_open(str(file), framework="pt") as handle:
            names.update(key.removesuffix(marker) for key in handle.keys() if key.endswith(marker))
    return frozenset(names)


def repack(weights: Iterator[tuple[str, torch.Tensor]], quant: CheckpointQuant
           ) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with each quantized module's parts replaced by the engine's
    qweight/scales(/offsets, input_perm), as soon as all its parts have been read."""
    parts = PARTS[quant.method]
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        prefix, _, part = name.rpartition(".")
        if prefix not in quant.modules or part not in parts:
            if prefix in quant.modules and part == "input_scale":
                raise ValueError(f"model: {name} is a static activation scale; fp8 loads dynamic activations only")
            yield name, tensor
            continue
        got = pending.setdefault(prefix, {})
        got[part] = tensor
        if len(got) == len(parts):
            del pending[prefix]
            for key, value in _convert(quant.for_module(prefix), got).items():
                yield f"{prefix}.{key}", value
    for prefix, got in pending.items():
        raise ValueError(f"model: {quant.method} checkpoint lacks {sorted(set(parts) - set(got))} of {prefix}")


def _convert(quant: CheckpointQuant, got: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if quant.method == "fp8":
        weight = got["weight"]
        if weight.dtype != torch.float8_e4m3fn or got["weight_scale"].numel() != 1:
            raise ValueError("model: fp8 checkpoint weights must be float8_e4m3fn with one weight_scale each")
        return {"qweight": weight, "scales": got["weight_scale"].reshape(1, 1).expand(weight.shape[0], 1)
                .to(torch.float16).contiguous()}
    if quant.method == "awq":
        codes, zeros = awq_unpack(got["qweight"]), awq_unpack(got["qzeros"])
        return to_engine_layout(codes, zeros, got["scales"], 4, quant.group_size or codes.shape[0])
    codes = unpack_int32(got["qweight"], quant.bits, dim=0)
    zeros = unpack_int32(got["qzeros"], quant.bits, dim=1) + quant.zero_offset
    group = quant.group_size or codes.shape[0]
    perm = act_order_perm(got["g_idx"], group)
    identity = bool((perm == torch.arange(perm.numel())).all())
    if not quant.act_order and not identity:
        raise ValueError("model: GPTQ g_idx is reordered but desc_act is false in quantization_config")
    converted = to_engine_layout(codes, zeros, got["scales"], quant.bits, group, perm if quant.act_order else None)
    if quant.act_order:
        converted["input_perm"] = perm
    return converted
