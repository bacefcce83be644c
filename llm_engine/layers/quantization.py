"""Quantization hook: a QuantMethod creates a linear layer's weights and applies them.

`UnquantizedLinearMethod` holds float weights; `WeightOnlyLinearMethod` holds int8 (per output
channel or group-wise), int4 (group-wise, symmetric or with zero points) or float8 E4M3 weights
and multiplies with them directly in the native kernel (csrc/quant_gemm.cpp), with float
activations, or (w8a8, w4a8) with activations rounded to int8 at run time and integer dot
products. On CUDA the Triton GEMMs of kernels/quant_gemm.py read the same packed weights
(w8a8/w4a8 round the activations first, as the PyTorch path does). Which layer gets which method
is decided in `quant_config`; the layers and models stay unchanged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from llm_engine.kernels.switch import use_triton
from llm_engine.layers.native import CpuKernels, cpu_kernels

# Above this many rows (prefill chunks) one dequantized copy per call and oneDNN's blocked matmul
# beat the row-by-row kernel; decode steps and small batches stay on the kernel.
KERNEL_MAX_ROWS = 16
# On 32-input int4/int8 groups (GGUF's Q4/Q8 blocks; in AVX2 builds int4 groups of a multiple of
# 64 too, `one_pass`) the kernel unpacks each group once per 8 rows and keeps up to here
# (csrc/quant_gemm.cpp's G32_MAX_ROWS): batched decode steps of up to 64 sequences; dequantizing
# SmolLM2's Q8_0 LM head for 64 rows cost ~2x the kernel's CPU time.
G32_KERNEL_MAX_ROWS = 64
# Where the CPU has AMX bf16 tiles, bfloat16 activations of more than KERNEL_MAX_ROWS and up to
# this many rows (batched decode steps) multiply on them (csrc/quant_gemm_amx_bf16.cpp: int4/int8
# groups dequantized to bf16 per 32 channels): ~6x less CPU than the float-activation kernel at
# 64 rows. Up to 16 rows (one sequence's speculative verification) stay on the kernel, whose rows
# are a one-row step's bit for bit; above this, oneDNN's blocking wins on the natively
# dequantized bf16 weight (measured at 512-2048 rows).
AMX_BF16_MAX_ROWS = 256
# In a step whose rows are all decodes (one-token steps and speculative verification rows), more
# than this many sequences take the tiles at any row count: the few-row kernel makes one pass over
# the weights per 8 rows, so on one core 9-16-row decode steps cost more than 17-32-row ones on the
# tiles. Counting sequences, not rows, keeps a verified row equal to that sequence's plain step.
# That is for 32-input groups; with other groups (64, 128, int8 per channel) the few-row kernel
# unpacks the weights once per row, and 2-8 rows cost 1.1-3.4x more on it than on the tiles, so
# there a decode step of more than one sequence takes the tiles (`one_pass` below).
AMX_BF16_MIN_DECODE_SEQUENCES = 8
_decode_sequences: ContextVar[int | None] = ContextVar("decode_sequences", default=None)


@contextmanager
def decode_step(sequences: int | None) -> Iterator[None]:
    """The model runner's forward pass of a step of `sequences` decoding sequences (None: the step
    has a prompt chunk), which picks the few-row kernel or the tiles by sequences (see above)."""
    token = _decode_sequences.set(sequences)
    try:
        yield
    finally:
        _decode_sequences.reset(token)


def takes_bf16_tiles(rows: int, one_pass: bool = True) -> bool:
    """Whether `rows` bfloat16 rows multiply on the AMX bf16 tiles rather than the float kernel
    (up to KERNEL_MAX_ROWS) or oneDNN (above AMX_BF16_MAX_ROWS). `one_pass`: the layer's few-row
    kernel makes one pass over the weights per 8 rows (32-input groups), else one per row."""
    sequences = _decode_sequences.get()
    fewest = AMX_BF16_MIN_DECODE_SEQUENCES if one_pass else 1
    many = rows > KERNEL_MAX_ROWS or (sequences is not None and sequences > fewest)
    return many and rows <= AMX_BF16_MAX_ROWS


class QuantLayer(Protocol):
    """What the methods read back from a layer they made weights on (a linear layer or an
    embedding table): nn.Module types its attributes only as `Tensor | Module`."""

    input_size: int
    weight: torch.Tensor
    qweight: torch.Tensor
    scales: torch.Tensor
    input_perm: torch.Tensor
    kernels: CpuKernels | None


class QuantMethod(ABC):
    @abstractmethod
    def create_weights(self, layer: nn.Module, input_size: int, output_size: int,
                       dtype: torch.dtype) -> None:
        """Register the layer's weight parameters (per-partition sizes)."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Compute x @ W^T (+ bias) with the layer's weights."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Turn loaded weights into the form `apply` runs fastest with (once, after loading)."""


def prepack(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's prepacked copy of a bfloat16 CPU weight, or None. Its linear gives the same bits
    as F.linear, faster (up to 2x for the few-row matmuls of decode steps); float32 stays on
    F.linear, whose results it would change."""
    if weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and onednn_bf16_available():
        packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        return packed
    return None


def weight_bytes(model: nn.Module) -> int:
    """Memory of a model's weights: its parameters (a tied one once) and oneDNN's prepacked
    copies, which replace a bf16 linear layer's parameter or sit beside an LM head's."""
    packed = [getattr(m, "packed_weight", None) for m in model.modules()]
    tensors = [*model.parameters(), *(t for t in packed if isinstance(t, torch.Tensor))]
    return sum(t.numel() * t.element_size() for t in tensors)


def onednn_bf16_available() -> bool:
    """oneDNN's bf16 linear needs AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT on x86."""
    return (torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return out


class UnquantizedLinearMethod(QuantMethod):
    def create_weights(self, layer: nn.Module, input_size: int, output_size: int,
                       dtype: torch.dtype) -> None:
        layer.weight = nn.Parameter(torch.empty(output_size, input_size, dtype=dtype), requires_grad=False)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        packed = prepack(cast(QuantLayer, layer).weight)
        if packed is not None:  # replaces the plain weight: no second copy
            layer.packed_weight = packed
            del layer.weight

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        packed = getattr(layer, "packed_weight", None)
        if packed is not None:
            return packed_linear(x, packed, bias)
        return F.linear(x, cast(QuantLayer, layer).weight, bias)


# Activations rounded to int8 come in blocks of this many inputs (the integer kernels' unit).
ACT_SUB_BLOCK = 32


@dataclass(frozen=True)
class QuantScheme:
    """One layer's weight format. int8: symmetric, per output channel (group_size None) or per
    group; int4: per group, symmetric or asymmetric (zero points); fp8: float8 E4M3 with a scale
    per output channel (or per group), or one for the whole matrix (per_tensor).
    w8a8 and w4a8 store int8 and int4 weights and round each token's activations to int8 at run
    time: w8a8 with one scale per token, w4a8 one per 32 inputs (llama.cpp's Q4 x Q8 arithmetic).
    (Plain int4 on groups of 32 inputs or a multiple of 64 rounds activations too, to int16, where
    the kernels are built without AVX-512: csrc/quant_gemm.cpp's rows_dot_int4.)"""

    method: str
    group_size: int | None = None
    symmetric: bool = True
    per_tensor: bool = False

    @property
    def weights(self) -> str:
        """The stored format: int8, int4 or fp8."""
        return {"w8a8": "int8", "w4a8": "int4"}.get(self.method, self.method)

    def act_block(self, k_in: int) -> int | None:
        """Inputs per activation scale, or None for float activations."""
        return {"w8a8": k_in, "w4a8": ACT_SUB_BLOCK}.get(self.method)

    @property
    def scales_tokens(self) -> bool:
        """Whether each token's activations take one scale (w8a8), so a row-parallel rank's share
        of a token must be scaled by the whole token's absmax, not its share's."""
        return self.method == "w8a8"

    def describe(self) -> str:
        if self.per_tensor:
            return f"{self.method} per-tensor"
        group = f" g{self.group_size}" if self.group_size else " per-channel"
        zeros = " sym" if self.weights == "int4" and self.symmetric else " asym" if self.weights == "int4" else ""
        return f"{self.method}{group}{zeros}"


def group_count(k_in: int, group: int) -> int:
    return -(-k_in // group)


def _grouped(w: torch.Tensor, group: int) -> torch.Tensor:
    """[N, K] -> [N, groups, group], the last group zero-padded."""
    pad = group_count(w.shape[1], group) * group - w.shape[1]
    return F.pad(w, (0, pad)).view(w.shape[0], -1, group)


def _ungrouped(w: torch.Tensor, k_in: int) -> torch.Tensor:
    return w.reshape(w.shape[0], -1)[:, :k_in]


def quantize_int8(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest symmetric int8: (q [N, K] int8, scales [N, groups] float16)."""
    g = _grouped(w.float(), group)
    scales = (g.abs().amax(-1) / 127).clamp(min=1e-7).half()
    q = torch.round(g / scales.float().unsqueeze(-1)).clamp(-127, 127).to(torch.int8)
    return _ungrouped(q, w.shape[1]).contiguous(), scales.contiguous()


def quantize_int4(w: torch.Tensor, group: int, symmetric: bool
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest int4 codes 0..15 [N, K] with w ~ q * scale + offset per group
    (float16 scales and offsets).
    Symmetric: zero point 8, scale absmax/7 (offset -8 * scale); asymmetric: scale (max - min)/15
    and offset min, a real-valued zero point as in GGUF's Q4_1 (an integer zero point z, AWQ/GPTQ's
    form, is the offset -z * scale), so the 16 levels span exactly the group's range."""
    g = _grouped(w.float(), group)
    if symmetric:
        scales = (g.abs().amax(-1) / 7).clamp(min=1e-7).half().float()
        offsets = -8 * scales
    else:
        offsets = g.amin(-1).half().float()
        scales = ((g.amax(-1) - offsets) / 15).clamp(min=1e-7).half().float()
    q = torch.round((g - offsets.unsqueeze(-1)) / scales.unsqueeze(-1)).clamp(0, 15).to(torch.uint8)
    return _ungrouped(q, w.shape[1]).contiguous(), scales.half().contiguous(), offsets.half().contiguous()


def quantize_fp8(w: torch.Tensor, group: int, per_tensor: bool,
                 whole_absmax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Float8 E4M3 (round to nearest even) with float16 scales [N, groups], absmax/448 per group,
    or the matrix's absmax/448 in every entry (per_tensor; `whole_absmax`: the whole tensor's when
    `w` is a column-parallel rank's rows of it)."""
    g = _grouped(w.float(), group)
    if whole_absmax is not None and not per_tensor:
        raise ValueError("quantize_fp8: a whole tensor's absmax is for a per-tensor scale")
    if not per_tensor:
        amax = g.abs().amax(-1)
    else:
        amax = g.abs().amax() if whole_absmax is None else whole_absmax.float()
    scales = (amax / 448).clamp(min=1e-7).half().expand(g.shape[:2])
    q = (g / scales.float().unsqueeze(-1)).clamp(-448, 448).to(torch.float8_e4m3fn)
    return _ungrouped(q.view(torch.uint8), w.shape[1]).contiguous().view(torch.float8_e4m3fn), scales.contiguous()


def quantize_activations(x: torch.Tensor, block: int, row_absmax: torch.Tensor | None = None) -> torch.Tensor:
    """float32 x [rows, K] as the integer kernels see it: rounded to int8 with one scale
    (absmax / 127) per `block` inputs, then scaled back. `row_absmax` [rows]: the absmax of each
    whole row when x is a row-parallel rank's share of it (block = K, one scale a row)."""
    g = x.float().reshape(x.shape[0], -1, block)
    if row_absmax is not None and g.shape[1] != 1:
        raise ValueError(f"quantize_activations: a row's absmax needs one block a row, got {g.shape[1]}")
    d = (g.abs().amax(-1, keepdim=True) if row_absmax is None else row_absmax.float().view(-1, 1, 1)) / 127
    q = torch.round(g / torch.where(d > 0, d, torch.ones_like(d))).clamp(-127, 127)
    return (q * d).view(x.shape)


def amx_bf16_fits(k_in: int, group: int) -> bool:
    """The bf16 tile kernel takes whole 32-input steps and groups (the last one too)."""
    return k_in % 32 == 0 and group % 32 == 0


def integer_kernel_fits(k_in: int, group: int, int4: bool) -> bool:
    """The integer kernels take K in 32-input sub-blocks; each int4 group (the last one too)
    must be 32 inputs or a multiple of 64 (one sub-block is then one run of low or high nibbles)."""
    lengths = {group, k_in % group or group}
    if k_in % ACT_SUB_BLOCK or any(length % ACT_SUB_BLOCK for length in lengths):
        return False
    return not int4 or all(length == 32 or length % 64 == 0 for length in lengths)


def pack_int4(q: torch.Tensor, group: int) -> torch.Tensor:
    """Codes [N, K] (K even) -> bytes [N, K/2]: in each group byte j holds element j in its low
    nibble and element j + len/2 in its high nibble (GGUF Q4_0/Q4_1 order; a shorter last group
    splits at its own half)."""
    n, k_in = q.shape
    full = k_in // group * group
    main = q[:, :full].to(torch.uint8).view(n, -1, 2, group // 2)
    tail = q[:, full:].to(torch.uint8).view(n, 2, -1)
    return torch.cat([(main[:, :, 0] | (main[:, :, 1] << 4)).view(n, -1), tail[:, 0] | (tail[:, 1] << 4)], 1)


def unpack_int4(packed: torch.Tensor, group: int) -> torch.Tensor:
    """Inverse of pack_int4: bytes [N, K/2] -> codes [N, K] (uint8)."""
    n, half_k = packed.shape
    full = half_k // (group // 2) * (group // 2)
    main = packed[:, :full].view(n, -1, 1, group // 2)
    tail = packed[:, full:]
    return torch.cat([torch.cat([main & 15, main >> 4], 2).view(n, -1), tail & 15, tail >> 4], 1)


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None,
               group: int) -> torch.Tensor:
    """The float32 weight [N, K] of an int8 or float8 (offsets None) or packed int4 weight."""
    q = qweight.float() if offsets is None else unpack_int4(qweight, group).float()
    k_in = q.shape[1]
    w = _grouped(q, group) * scales.float().unsqueeze(-1)
    if offsets is not None:
        w = w + offsets.float().unsqueeze(-1)
    return _ungrouped(w, k_in)


_QWEIGHT_DTYPES = {"int8": torch.int8, "int4": torch.uint8, "fp8": torch.float8_e4m3fn}


class WeightOnlyLinearMethod(QuantMethod):
    """int8/int4/fp8 weights (`qweight`, float16 `scales` [N, groups], int4 also `offsets`) that
    the native kernel multiplies without a float copy; without a compiler, and for prefill-sized
    inputs, one dequantized F.linear per call (w8a8/w4a8: on activations rounded the same way).

    `prequantized`: the checkpoint holds these tensors (GGUF Q4_0/Q4_1/Q8_0 blocks, AWQ/GPTQ
    repacked); otherwise the layer loads a float `weight` and rounds it to nearest once loaded.
    `act_order`: the weight's inputs are stored in another order (GPTQ's desc_act), `input_perm`,
    in which the layer gathers its activations first."""

    def __init__(self, scheme: QuantScheme, prequantized: bool = False, act_order: bool = False) -> None:
        if scheme.weights not in _QWEIGHT_DTYPES:
            raise ValueError(f"quantization: unknown weight-only method {scheme.method!r}")
        self.scheme, self.prequantized, self.act_order = scheme, prequantized, act_order

    def group(self, layer: nn.Module) -> int:
        return self.scheme.group_size or cast(QuantLayer, layer).input_size

    def one_pass(self, layer: nn.Module) -> bool:
        """Whether this layer's decode batches stay on the few-row kernel, which unpacks each group
        once per 8 rows: int4/int8 in 32-input groups, and where it rounds int4 activations to int16
        (AVX2 builds) int4 groups of a multiple of 64 too. AVX-512 builds' kernel also unpacks other
        multiples of 32 once per 8 rows, but there 2-8 bf16 sequences of them run faster on the AMX
        tiles (stop 38, ~1B int4 g128, 8 rows: its layers' matmuls ~250 CPU ms on the kernel, a whole
        decode step 114 on the tiles), so they answer False."""
        quant_layer = cast(QuantLayer, layer)
        k_in, group = quant_layer.input_size, self.group(layer)
        if self.scheme.weights == "fp8":
            return False
        if group == 32 and k_in % 32 == 0:
            return True
        kernels = quant_layer.kernels
        return (self.scheme.weights == "int4" and kernels is not None and kernels.int4_activation_bits == 16
                and integer_kernel_fits(k_in, group, int4=True))

    def bf16_tiles(self, layer: nn.Module, k_in: int) -> CpuKernels | None:
        """The kernels whose AMX bf16 tiles can multiply this layer's weights by bfloat16
        activations of `k_in` inputs (after any act-order permutation), or None."""
        quant_layer = cast(QuantLayer, layer)
        kernels = quant_layer.kernels
        fits = (kernels is not None and kernels.amx_bf16 is not None and self.scheme.weights != "fp8"
                and not self.scheme.act_block(quant_layer.input_size) and amx_bf16_fits(k_in, self.group(layer)))
        return kernels if fits else None

    def batch_takes_bf16_tiles(self, layer: nn.Module, dtype: torch.dtype) -> bool:
        """Whether a decode step of 2-8 sequences with `dtype` activations multiplies this layer on
        the AMX bf16 tiles (rather than on the few-row kernel, as the fused decode step would)."""
        quant_layer = cast(QuantLayer, layer)
        k_in = quant_layer.input_perm.numel() if self.act_order else quant_layer.input_size
        return dtype == torch.bfloat16 and self.bf16_tiles(layer, k_in) is not None and not self.one_pass(layer)

    def integer_kernel_takes(self, layer: nn.Module, kernels: CpuKernels, rows: int) -> bool:
        """Whether w8a8/w4a8 multiply `rows` rows in integers (else their rounded activations take
        the float kernel or a dequantized matmul): up to KERNEL_MAX_ROWS, or at every size on AMX
        tiles or for int4 weights eight channels a pass, which beat both there, prefill included."""
        quant_layer = cast(QuantLayer, layer)
        return rows <= KERNEL_MAX_ROWS or kernels.amx is not None or (
            self.scheme.weights == "int4" and kernels.int4_q8_columns_fit(
                quant_layer.qweight.shape[0], quant_layer.qweight.shape[1] * 2, self.group(layer)))

    def kernel_max_rows(self, layer: nn.Module) -> int:
        """Rows up to which the float-activation kernel runs rather than a dequantized matmul."""
        return G32_KERNEL_MAX_ROWS if self.one_pass(layer) else KERNEL_MAX_ROWS

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int,
                       dtype: torch.dtype) -> None:
        int4 = self.scheme.weights == "int4"
        if int4 and (input_size % 2 or (self.scheme.group_size or 2) % 2):
            raise ValueError(f"quantization: int4 needs an even input size and group size, "
                             f"got {input_size} and {self.scheme.group_size}")
        group = self.scheme.group_size or input_size
        if self.scheme.act_block(input_size) and not integer_kernel_fits(input_size, group, int4):
            raise ValueError(f"quantization: {self.scheme.method} needs an input size that is a multiple of 32 "
                             f"and groups of 32 or a multiple of 64, got {input_size} and {group}")
        if not self.prequantized:
            layer.weight = nn.Parameter(torch.empty(output_size, input_size, dtype=dtype), requires_grad=False)
            return
        groups = group_count(input_size, group)
        layer.qweight = nn.Parameter(torch.empty(output_size, input_size // 2 if int4 else input_size,
                                                 dtype=_QWEIGHT_DTYPES[self.scheme.weights]), requires_grad=False)
        layer.scales = nn.Parameter(torch.empty(output_size, groups, dtype=torch.float16), requires_grad=False)
        if int4:
            layer.offsets = nn.Parameter(torch.empty(output_size, groups, dtype=torch.float16), requires_grad=False)
        if self.act_order:
            layer.input_perm = nn.Parameter(torch.empty(input_size, dtype=torch.int64), requires_grad=False)
            layer.input_perm.weight_loader = load_input_perm  # type: ignore[attr-defined]  # as linear.py's loaders

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        quant_layer = cast(QuantLayer, layer)
        if not self.prequantized:
            weight, group = quant_layer.weight.data, self.group(layer)
            del layer.weight
            if self.scheme.weights == "int8":
                q, scales = quantize_int8(weight, group)
            elif self.scheme.weights == "fp8":
                q, scales = quantize_fp8(weight, group, self.scheme.per_tensor, getattr(layer, "whole_absmax", None))
            else:
                codes, scales, offsets = quantize_int4(weight, group, self.scheme.symmetric)
                q = pack_int4(codes, group)
                layer.offsets = nn.Parameter(offsets, requires_grad=False)
            layer.qweight = nn.Parameter(q, requires_grad=False)
            layer.scales = nn.Parameter(scales, requires_grad=False)
        quant_layer.kernels = cpu_kernels() if quant_layer.qweight.device.type == "cpu" else None

    def note_whole(self, layer: nn.Module, loaded: torch.Tensor, dtype: torch.dtype) -> None:
        """Called with a float weight before a rank keeps its rows of it: where one scale rounds the
        whole tensor (fp8 per tensor), note its absmax (as `dtype`; the largest over a fused layer's
        parts), so that scale is one rank's rather than each rank's rows'."""
        if self.prequantized or not self.scheme.per_tensor:
            return
        absmax = loaded.abs().amax().to(dtype)  # rounding keeps order: the absmax of the weight as loaded
        noted = getattr(layer, "whole_absmax", None)
        layer.whole_absmax = absmax if noted is None else torch.maximum(noted, absmax)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None,
              row_absmax: torch.Tensor | None = None) -> torch.Tensor:
        """As QuantMethod's; `row_absmax` (w8a8 at more than one rank): each token's absmax over the
        whole row, which scales its activations instead of this rank's share's."""
        quant_layer = cast(QuantLayer, layer)
        offsets = getattr(layer, "offsets", None)
        if self.act_order:  # a longer order reads zeros past the inputs (a rank's padding, layers/row_shards.py)
            perm = quant_layer.input_perm
            x = (x if perm.numel() == x.shape[-1] else F.pad(x, (0, 1))).index_select(-1, perm)
        rows = x.numel() // x.shape[-1]
        act_block = self.scheme.act_block(quant_layer.input_size)
        triton = use_triton(x)
        kernels = quant_layer.kernels
        bf16_tiles = self.bf16_tiles(layer, x.shape[-1]) if x.dtype == torch.bfloat16 else None
        if bf16_tiles is not None and takes_bf16_tiles(rows, self.one_pass(layer)):
            out = bf16_tiles.quant_gemm_bf16(x.reshape(rows, -1), quant_layer.qweight, quant_layer.scales, offsets,
                                             self.group(layer)).view(*x.shape[:-1], -1)
            return out if bias is None else out + bias
        native_kernels = kernels if kernels is not None and not triton else None
        if act_block and native_kernels is not None and self.integer_kernel_takes(layer, native_kernels, rows):
            out = native_kernels.quant_gemm_q8(x.reshape(rows, -1).float(), quant_layer.qweight, quant_layer.scales,
                                               offsets, self.group(layer), act_block, row_absmax)
            return _rows_out(out, x, bias)
        if act_block:  # rounded as the integer kernels round them, then multiplied as float (below)
            x = quantize_activations(x.reshape(rows, -1), act_block, row_absmax).view(x.shape).to(x.dtype)
        if native_kernels is not None and rows <= self.kernel_max_rows(layer):
            out = native_kernels.quant_gemm(x.reshape(rows, -1).float(), quant_layer.qweight, quant_layer.scales,
                                            offsets, self.group(layer))
            return _rows_out(out, x, bias)
        if triton:
            from llm_engine.kernels.quant_gemm import quant_gemm  # imports Triton: only when a GPU path runs

            return quant_gemm(x, quant_layer.qweight, quant_layer.scales, offsets, self.group(layer), bias)
        if kernels is not None:  # dequantize's bits natively (bf16 ones straight from the codes), into a reused buffer
            return kernels.dequantized_linear(x, quant_layer.qweight, quant_layer.scales, offsets, self.group(layer), bias)
        weight = dequantize(quant_layer.qweight, quant_layer.scales, offsets, self.group(layer)).to(x.dtype)
        return F.linear(x, weight, bias)


def _rows_out(out: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A kernel's [rows, N] float32 result back in x's leading shape and dtype, plus the bias."""
    out = out.view(*x.shape[:-1], -1).to(x.dtype)
    return out if bias is None else out + bias


def load_input_perm(param: nn.Parameter, loaded: torch.Tensor, *shard: object) -> None:
    """One input order for the whole layer: projections fused into it (q/k/v, gate/up) share
    their input, so they must share the order too (GPTQ derives it from that input)."""
    if getattr(param, "loaded", False) and not torch.equal(param.data, loaded):
        raise ValueError("model: act-order projections fused into one layer have different input orders (g_idx)")
    param.data.copy_(loaded)
    param.loaded = True  # type: ignore[attr-defined]  # marks the shared order as set
