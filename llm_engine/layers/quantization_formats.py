"""The published AWQ and GPTQ tensor layouts, and their repacking into the engine's int4/int8 one.

Both store w[k, n] = (q - z) * s for input k, output n, with codes q, integer zero points z and
float16 scales s per group of inputs, the codes `32 / bits` to an int32 word, lowest bits first:
  AWQ (AutoAWQ's GEMM version, 4 bits): `qweight` [K, N/8] and `qzeros` [K/group, N/8] packed
      along the outputs in the interleaved order AWQ_ORDER, `scales` [K/group, N].
  GPTQ (AutoGPTQ): `qweight` [K*bits/32, N] packed along the inputs, `qzeros` [groups, N*bits/32]
      along the outputs in plain order, holding z - 1 (the v1 format; "gptq_v2" holds z),
      `scales` [groups, N], and `g_idx` [K], each input's group: i // group, or with act-order
      (desc_act) the groups in the order the columns were quantized.
The engine's int4 layout keeps the codes (Q4's nibble order, layers/quantization.pack_int4) with
the scale and an offset -z * s per group (rounded to float16, the layout's one scale type); 8-bit
GPTQ becomes int8 q - 128 when every zero point is 128 (symmetric). Act-order weights are
reordered so that each group's inputs are contiguous, and the layer gathers its activations in
that order (`input_perm`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch

from llm_engine.layers.quantization import QuantScheme, _grouped, group_count, pack_int4


@dataclass(frozen=True)
class CheckpointQuant:
    """A checkpoint's own quantization: method, bits, group size (None: one group per output
    row), act-order, what GPTQ's stored zero points lack (1 in the v1 format), the checkpoint
    names of the modules stored quantized, and GPTQ's per-module overrides (`dynamic`: pattern,
    bits, group size; e.g. the int8 tables `codeyard llm quantize` writes beside int4 layers)."""

    method: str
    bits: int
    group_size: int | None
    act_order: bool = False
    zero_offset: int = 0
    modules: frozenset[str] = frozenset()
    dynamic: tuple[tuple[str, int, int | None], ...] = ()

    def for_module(self, name: str) -> CheckpointQuant:
        """How the module `name` is stored: the first `dynamic` pattern that matches its name from
        the start (vLLM's reading of GPTQModel's overrides) replaces bits and group size."""
        for pattern, bits, group in self.dynamic:
            if re.match(pattern, name):
                return replace(self, bits=bits, group_size=group, dynamic=())
        return self

    @property
    def scheme(self) -> QuantScheme:
        """The engine layout it loads into."""
        if self.method == "fp8":
            return QuantScheme("fp8", per_tensor=True)
        if self.bits == 8:
            return QuantScheme("int8", self.group_size)
        return QuantScheme("int4", self.group_size, symmetric=False)

    def describe(self) -> str:
        if self.method == "fp8":
            return "fp8 checkpoint"
        group = f"g{self.group_size}" if self.group_size else "per-channel"
        return f"{self.method} {self.bits}-bit {group}{' act-order' if self.act_order else ''}"


AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a word holds output 8c + AWQ_ORDER[i]
_AWQ_UNDO = tuple(AWQ_ORDER.index(i) for i in range(8))


def _shifts(bits: int) -> torch.Tensor:
    return torch.arange(0, 32, bits, dtype=torch.int32)


def unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 words [R, C] holding 32/bits codes each (lowest bits first) along `dim` (0 or 1)
    -> the codes as int32, that dim 32/bits times longer."""
    per, mask = 32 // bits, (1 << bits) - 1
    rows, cols = packed.shape
    if dim == 0:
        codes = (packed.unsqueeze(1) >> _shifts(bits).view(1, -1, 1)) & mask
        return codes.reshape(rows * per, cols)
    codes = (packed.unsqueeze(2) >> _shifts(bits).view(1, 1, -1)) & mask
    return codes.reshape(rows, cols * per)


def pack_int32(codes: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Inverse of unpack_int32: codes [R, C] (0 .. 2^bits - 1) -> int32 words."""
    per = 32 // bits
    wide = codes.to(torch.int64)
    wide = wide.view(-1, per, wide.shape[1]) if dim == 0 else wide.view(wide.shape[0], -1, per)
    words = (wide << _shifts(bits).to(torch.int64).view((1, -1, 1) if dim == 0 else (1, 1, -1))).sum(1 + (dim == 1))
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # the same 32 bits, signed


def awq_unpack(packed: torch.Tensor) -> torch.Tensor:
    """AWQ qweight/qzeros [R, N/8] -> codes [R, N] in output order."""
    codes = unpack_int32(packed, 4, dim=1)
    return codes.view(codes.shape[0], -1, 8)[..., list(_AWQ_UNDO)].reshape(codes.shape)


def awq_pack(codes: torch.Tensor) -> torch.Tensor:
    """Codes [R, N] in output order -> AWQ's interleaved int32 words [R, N/8]."""
    return pack_int32(codes.view(codes.shape[0], -1, 8)[..., list(AWQ_ORDER)].reshape(codes.shape), 4, dim=1)


def act_order_perm(g_idx: torch.Tensor, group: int) -> torch.Tensor:
    """The input order that makes GPTQ's groups contiguous (each input's group from g_idx);
    raises unless the groups are `group` inputs each (the last may be shorter), as GPTQ writes them."""
    perm = torch.argsort(g_idx.to(torch.int64), stable=True)
    expected = torch.arange(g_idx.numel()) // group
    if not torch.equal(g_idx.to(torch.int64)[perm], expected):
        raise ValueError(f"model: GPTQ g_idx does not split the inputs into groups of {group}")
    return perm


def to_engine_layout(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, bits: int,
                     group: int, perm: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """codes [K, N], zeros and scales [groups, N] with w[k, n] = (q - z) * s -> the engine's
    qweight/scales(/offsets) [N, ...], inputs taken in `perm` order when given."""
    k_in, n_out = codes.shape
    if scales.shape != zeros.shape or scales.shape != (group_count(k_in, group), n_out):
        raise ValueError(f"model: quantized weight of {k_in}x{n_out} with group {group} has scales "
                         f"{tuple(scales.shape)} and zero points {tuple(zeros.shape)}")
    codes_nk = codes.t() if perm is None else codes.t()[:, perm]
    scales_ng = scales.t().contiguous().to(torch.float16)
    if bits == 4:
        offsets = -(zeros.t().float() * scales_ng.float())
        return {"qweight": pack_int4(codes_nk.to(torch.uint8), group), "scales": scales_ng,
                "offsets": offsets.to(torch.float16).contiguous()}
    if not bool((zeros == 128).all()):
        raise ValueError("model: 8-bit GPTQ is loaded symmetric only (every zero point 128)")
    return {"qweight": (codes_nk - 128).to(torch.int8).contiguous(), "scales": scales_ng}


def grid(values: torch.Tensor, bits: int, symmetric: bool, min_zero: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ's quantizer: float16 scales and int32 zero points for the last dim of `values`, its
    range widened to include 0; symmetric: z = 2^(bits-1), s = 2 max|w| / (2^bits - 1); else
    s = (max - min) / (2^bits - 1), z = round(-min / s), at least `min_zero` (GPTQ's v1 format
    cannot store z = 0)."""
    maxq = 2**bits - 1
    low, high = values.amin(-1).clamp(max=0), values.amax(-1).clamp(min=0)
    if symmetric:
        scales = (torch.maximum(-low, high) * 2 / maxq).clamp(min=1e-7).half()
        return scales, torch.full_like(scales, (maxq + 1) // 2, dtype=torch.int32)
    scales = ((high - low) / maxq).clamp(min=1e-7).half()
    return scales, torch.round(-low / scales.float()).clamp(min_zero, maxq).to(torch.int32)


def round_to_grid(values: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes of `values` on the grid (scales and zeros broadcast against it)."""
    return (torch.round(values / scales.float()) + zeros).clamp(0, 2**bits - 1)


def quantize_rtn(w: torch.Tensor, bits: int, group: int, symmetric: bool, min_zero: int = 0
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest on `grid`'s scales, GPTQ's quantizer without its error compensation.
    Returns codes [K, N] and zero points and float16 scales [groups, N] for w [N, K] (the
    transposed, checkpoint orientation)."""
    g = _grouped(w.float(), group)
    scales, zeros = grid(g, bits, symmetric, min_zero)
    codes = round_to_grid(g, scales.unsqueeze(-1), zeros.unsqueeze(-1), bits)
    codes = codes.to(torch.int32).reshape(w.shape[0], -1)[:, :w.shape[1]]
    return codes.t().contiguous(), zeros.t().contiguous(), scales.t().contiguous()
