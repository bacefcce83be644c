"""Builds and loads the engine's C++ CPU kernels (csrc/) on first use: paged decode attention and
the decoder layer's fused elementwise steps (RMSNorm with the residual add, rotary, SiLU * up) and
the int8/int4 weight-only matmuls of the quantized linear layers, and the single-sequence decode
step that chains them for a whole decoder stack (decode_stack.cpp).

The sources are compiled once per machine with the system C++ compiler (-march=native, OpenMP) into
a cache folder keyed by the sources, the flags and the CPU's features, then loaded with ctypes. The
shared library links the same libgomp that torch has already loaded, so kernels and torch share
one thread pool. Set CODEYARD_KERNEL_CACHE to choose the folder.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

CSRC = Path(__file__).parent / "csrc"
SOURCES = [CSRC / "paged_attention.cpp", CSRC / "elementwise.cpp", CSRC / "quant_gemm.cpp", CSRC / "quant_gemm_amx.cpp",
           CSRC / "quant_gemm_amx_bf16.cpp", CSRC / "quant_gemm_q8_columns.cpp", CSRC / "decode_stack.cpp"]
HEADERS = [CSRC / "simd.h", CSRC / "amx.h"]
# -ffp-contract=off: a*b - c*d stays two roundings, as in the PyTorch code the kernels replace.
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]


# From this many rows the integer-activation matmuls run on AMX tiles (16 rows each) where there are any.
AMX_MIN_ROWS = 2


class KernelBuildError(RuntimeError):
    """The C++ kernels could not be compiled or loaded on this machine."""


def _cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "codeyard" / "kernels"
    return Path(os.environ.get("CODEYARD_KERNEL_CACHE") or default)


def _cpu_flags() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((line for line in lines if line.startswith("flags")), "")


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        result = subprocess.run([compiler, *FLAGS, "-o", str(partial), *map(str, SOURCES)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise KernelBuildError(f"{compiler} failed: {result.stderr.strip()[-2000:]}")
        partial.replace(target)  # atomic: concurrent builders never see a half-written library


@functools.cache
def load_kernels() -> ctypes.CDLL:
    """The compiled kernel library, building it first if this machine has no cached copy."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise KernelBuildError("no C++ compiler found (install g++ or set CXX)")
    sources = [path.read_bytes() for path in SOURCES + HEADERS]
    key = hashlib.sha256(b"\0".join([*sources, " ".join(FLAGS).encode(), compiler.encode(),
                                      _cpu_flags().encode()])).hexdigest()[:16]
    target = _cache_dir() / f"kernels-{key}.so"
    if not target.is_file():
        _build(compiler, target)
    try:
        library = ctypes.CDLL(str(target))
    except OSError as exc:
        raise KernelBuildError(f"cannot load {target}: {exc}") from exc
    pointer, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
    signatures = {"paged_decode": [pointer] * 6 + [i32] * 6 + [f32],
                  "rms_norm": [pointer] * 4 + [i64, i32, f32],
                  "rotary": [pointer] * 5 + [i64, i32, i32, i32, i32, i64, i64],
                  "silu_and_mul": [pointer] * 2 + [i64, i32],
                  "write_kv": [pointer] * 6 + [i64, i32, i32, i32, i64, i64]}
    for name, argtypes in signatures.items():
        for suffix in ("f32", "bf16"):
            function = getattr(library, f"{name}_{suffix}")
            function.argtypes = argtypes
            function.restype = None
    for name, argtypes in {"int8_gemm_f32": [pointer] * 4 + [i64] * 4,
                           "int4_gemm_f32": [pointer] * 5 + [i64] * 4,
                           "fp8_gemm_f32": [pointer] * 4 + [i64] * 4,
                           "dequantize_f32": [i32] + [pointer] * 4 + [i64] * 3,
                           "quantize_rows_q8": [pointer] + [i64] * 3 + [pointer] * 3,
                           "int8_gemm_q8": [pointer] * 6 + [i64] * 4,
                           "int4_gemm_q8": [pointer] * 7 + [i64] * 4,
                           "decode_stack_f32": [pointer, pointer, i64, pointer, pointer, i32, pointer]}.items():
        getattr(library, name).argtypes = argtypes
        getattr(library, name).restype = None
    library.int4_few_rows_bf16_amx.argtypes = [pointer] * 5 + [i64] * 4  # 1 done, 0 not here (quant_gemm.cpp)
    library.int4_few_rows_bf16_amx.restype = i32
    library.int4_activation_bits.argtypes, library.int4_activation_bits.restype = [], i32
    library.int4_q8_columns_fit.argtypes, library.int4_q8_columns_fit.restype = [i64] * 3, i32
    library.amx_int8_ready.argtypes, library.amx_int8_ready.restype = [], i32
    library.amx_bf16_ready.argtypes, library.amx_bf16_ready.restype = [], i32
    if library.amx_bf16_ready():
        library.weight_only_gemm_bf16_amx.argtypes = [pointer] * 5 + [i64] * 4
        library.weight_only_gemm_bf16_amx.restype = None
        library.weight_only_dequantize_bf16.argtypes = [pointer] * 4 + [i64] * 3
        library.weight_only_dequantize_bf16.restype = None
    if library.amx_int8_ready():  # built only where the compiler targets AMX
        for name, argtypes in {"int8_gemm_q8_amx": [pointer] * 6 + [i64] * 4,
                               "int4_gemm_q8_amx": [pointer] * 7 + [i64] * 4}.items():
            getattr(library, name).argtypes = argtypes
            getattr(library, name).restype = None
    return library


# A prefill chunk's dequantized weight: one buffer per thread, shared by every CpuKernels (each
# layer holds its own instance). Per instance, SmolLM2's ~120 quantized layers kept ~210 MB of
# them after a prefill, each cold in cache when its layer came round again.
_REUSED = threading.local()


class CpuKernels:
    """The layers' fused CPU steps over torch tensors (float32 or bfloat16, on the CPU)."""

    _SUFFIXES = {torch.float32: "f32", torch.bfloat16: "bf16"}
    REUSED_BYTES = 64 << 20

    def __init__(self, library: ctypes.CDLL) -> None:
        self._functions = {(name, dtype): getattr(library, f"{name}_{suffix}")
                           for name in ("rms_norm", "rotary", "silu_and_mul")
                           for dtype, suffix in self._SUFFIXES.items()}
        self._int8_gemm, self._int4_gemm = library.int8_gemm_f32, library.int4_gemm_f32
        self._fp8_gemm = library.fp8_gemm_f32
        self._dequantize = library.dequantize_f32
        self._quantize_rows = library.quantize_rows_q8
        self._int8_gemm_q8, self._int4_gemm_q8 = library.int8_gemm_q8, library.int4_gemm_q8
        # AMX tiles for batches (csrc/quant_gemm_amx.cpp): None where the CPU or the build lacks them
        self.amx = (library.int8_gemm_q8_amx, library.int4_gemm_q8_amx) if library.amx_int8_ready() else None
        # bfloat16 activations x int4/int8 weights on AMX bf16 tiles (csrc/quant_gemm_amx_bf16.cpp), or None
        self.amx_bf16 = library.weight_only_gemm_bf16_amx if library.amx_bf16_ready() else None
        self._dequantize_bf16 = library.weight_only_dequantize_bf16 if library.amx_bf16_ready() else None
        # 16: quant_gemm's int4 rows (up to 64) of groups of 32 inputs or a multiple of 64 round
        # activations to int16 per 32 inputs (AVX2 builds without AVX-512, where that beat float32
        # activations), else 32 (float32)
        self.int4_activation_bits: int = library.int4_activation_bits()
        self._int4_q8_columns_fit = library.int4_q8_columns_fit

    def int4_q8_columns_fit(self, n_out: int, k_in: int, group_size: int) -> bool:
        """Whether quant_gemm_q8 multiplies int4 weights of this shape on eight channels a pass
        (csrc/quant_gemm_q8_columns.cpp), which beats a dequantized matmul at every row count."""
        return bool(self._int4_q8_columns_fit(n_out, k_in, group_size))

    def supports(self, x: torch.Tensor) -> bool:
        return x.device.type == "cpu" and x.dtype in self._SUFFIXES

    def rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> torch.Tensor:
        """RMSNorm of x, or of `residual += x` (in place) when a residual is given."""
        hidden = x.shape[-1]
        x = x.contiguous()
        out = torch.empty_like(x)
        if residual is not None and not residual.is_contiguous():
            raise ValueError("residual: must be contiguous")
        self._functions["rms_norm", x.dtype](x.data_ptr(), 0 if residual is None else residual.data_ptr(),
                                             weight.data_ptr(), out.data_ptr(), x.numel() // hidden, hidden, eps)
        return out

    def rotary(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor) -> None:
        """Rotate q [tokens, heads, dim] and k [tokens, kv_heads, dim] in place, the first
        2 * cos.shape[-1] dims of each head (all of them, or a partial rotary's part); each token's
        heads must be contiguous (a row of a fused qkv output is)."""
        for t in (q, k):
            if t.stride(-1) != 1 or t.stride(-2) != t.shape[-1]:
                raise ValueError("rotary: each token's heads must be contiguous")
        if 2 * cos.shape[-1] > q.shape[-1] or k.shape[-1] != q.shape[-1]:
            raise ValueError("rotary: q and k need the same head_dim, at least twice the tables' width")
        positions = positions.contiguous()
        self._functions["rotary", q.dtype](positions.data_ptr(), q.data_ptr(), k.data_ptr(), cos.data_ptr(),
                                           sin.data_ptr(), q.shape[0], q.shape[1], k.shape[1], q.shape[2],
                                           2 * cos.shape[-1], q.stride(0), k.stride(0))

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up over x = [..., gate | up]."""
        x = x.contiguous()
        width = x.shape[-1] // 2
        out = torch.empty(*x.shape[:-1], width, dtype=x.dtype, device=x.device)
        self._functions["silu_and_mul", x.dtype](x.data_ptr(), out.data_ptr(), out.numel() // width, width)
        return out


    def quant_gemm(self, x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                   offsets: torch.Tensor | None, group_size: int) -> torch.Tensor:
        """x @ W^T in float32 for W in the kernel's int8, float8 E4M3 (offsets None; told apart by
        qweight's dtype) or int4 layout (csrc/quant_gemm.cpp: float16 scales/offsets); x is
        float32 [rows, K]."""
        if scales.dtype != torch.float16 or (offsets is not None and offsets.dtype != torch.float16):
            raise ValueError("quant_gemm: scales and offsets must be float16")
        x = x.contiguous()
        rows, k_in = x.shape
        out = torch.empty(rows, qweight.shape[0], dtype=torch.float32)
        if offsets is None:
            gemm = self._fp8_gemm if qweight.dtype == torch.float8_e4m3fn else self._int8_gemm
            gemm(x.data_ptr(), qweight.data_ptr(), scales.data_ptr(), out.data_ptr(), rows, qweight.shape[0],
                 k_in, group_size)
        else:
            self._int4_gemm(x.data_ptr(), qweight.data_ptr(), scales.data_ptr(), offsets.data_ptr(),
                            out.data_ptr(), rows, qweight.shape[0], k_in, group_size)
        return out

    def quant_gemm_bf16(self, x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                        offsets: torch.Tensor | None, group_size: int) -> torch.Tensor:
        """x @ W^T for bfloat16 x [rows, K] and int8 or packed int4 W on AMX bf16 tiles: W's groups
        dequantized to bfloat16 (dequantize's values, rounded as `.to(torch.bfloat16)` rounds)
        and multiplied in float32, returned in bfloat16. Needs `amx_bf16` and groups that are
        multiples of 32 inputs (`amx_bf16_fits`)."""
        if self.amx_bf16 is None:
            raise ValueError("quant_gemm_bf16: this CPU or build has no AMX bf16 tiles")
        if x.dtype != torch.bfloat16 or qweight.dtype not in (torch.int8, torch.uint8):
            raise ValueError("quant_gemm_bf16: needs bfloat16 activations and int8 or int4 weights")
        x = x.contiguous()
        rows, k_in = x.shape
        out = torch.empty(rows, qweight.shape[0], dtype=torch.bfloat16)
        self.amx_bf16(x.data_ptr(), qweight.data_ptr(), scales.data_ptr(), 0 if offsets is None else offsets.data_ptr(),
                      out.data_ptr(), rows, qweight.shape[0], k_in, group_size)
        return out

    def dequantized_linear(self, x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                           offsets: torch.Tensor | None, group_size: int,
                           bias: torch.Tensor | None = None) -> torch.Tensor:
        """F.linear(x, W, bias) with W the dequantized weight as x's dtype (bfloat16 x with AMX
        bf16's build and groups of multiples of 32 inputs: `dequantize_bf16`'s bits, natively;
        otherwise `dequantize`'s, then `.to(x.dtype)`): a prefill chunk's matmul. W lands in this
        thread's reused buffer (up to REUSED_BYTES: a fresh one costs its page faults, ~8x the
        unpacking on a prefill chunk), which no caller ever sees: the next call overwrites it."""
        if x.dtype == torch.bfloat16 and self.bf16_dequantizes(qweight, offsets, group_size):
            weight = self._dequantize_bf16_into(qweight, scales, offsets, group_size, reuse=True)
        else:
            weight = self._dequantize_into(qweight, scales, offsets, group_size, reuse=True).to(x.dtype)
        return torch.nn.functional.linear(x, weight, bias)

    def bf16_dequantizes(self, qweight: torch.Tensor, offsets: torch.Tensor | None, group_size: int) -> bool:
        """Whether `dequantize_bf16` takes this int8 or packed int4 weight (AMX bf16's build,
        groups of multiples of 32 inputs)."""
        k_in = qweight.shape[1] * 2 if offsets is not None else qweight.shape[1]
        return (self._dequantize_bf16 is not None and qweight.dtype in (torch.int8, torch.uint8)
                and k_in % 32 == 0 and group_size % 32 == 0)

    def dequantize_bf16(self, qweight: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None,
                        group_size: int) -> torch.Tensor:
        """The bfloat16 weight [N, K] of an int8 or packed int4 one (`dequantize(...).bfloat16()`'s
        bits) in a tensor of its own; needs AMX bf16's build and groups of multiples of 32 inputs
        (`bf16_dequantizes`)."""
        return self._dequantize_bf16_into(qweight, scales, offsets, group_size, reuse=False)

    def dequantize(self, qweight: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None,
                   group_size: int) -> torch.Tensor:
        """The float32 weight [N, K] of a packed int8/float8/int4 one, bit for bit
        quantization.dequantize's (layouts as in quant_gemm), in a tensor of its own."""
        return self._dequantize_into(qweight, scales, offsets, group_size, reuse=False)

    def _dequantize_bf16_into(self, qweight: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None,
                              group_size: int, reuse: bool) -> torch.Tensor:
        if self._dequantize_bf16 is None:
            raise ValueError("dequantize_bf16: this CPU or build has no AMX bf16 kernels")
        if not self.bf16_dequantizes(qweight, offsets, group_size):
            raise ValueError(f"dequantize_bf16: needs int8 or int4 weights with inputs and groups in multiples of "
                             f"32, got {qweight.dtype}, group {group_size}")
        self._check_scales("dequantize_bf16", scales, offsets)
        n_out = qweight.shape[0]
        k_in = qweight.shape[1] * 2 if offsets is not None else qweight.shape[1]
        numel = n_out * k_in
        storage = _weight_buffer(-(-numel // 2), self.REUSED_BYTES) if reuse else torch.empty(-(-numel // 2))
        out = storage.view(torch.bfloat16)[:numel].view(n_out, k_in)
        self._dequantize_bf16(qweight.data_ptr(), scales.data_ptr(), 0 if offsets is None else offsets.data_ptr(),
                              out.data_ptr(), n_out, k_in, group_size)
        return out

    def _dequantize_into(self, qweight: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None,
                         group_size: int, reuse: bool) -> torch.Tensor:
        self._check_scales("dequantize", scales, offsets)
        kind = 1 if offsets is not None else 2 if qweight.dtype == torch.float8_e4m3fn else 0
        n_out = qweight.shape[0]
        k_in = qweight.shape[1] * 2 if offsets is not None else qweight.shape[1]
        out = (_weight_buffer(n_out * k_in, self.REUSED_BYTES) if reuse else torch.empty(n_out * k_in)).view(n_out, k_in)
        self._dequantize(kind, qweight.data_ptr(), scales.data_ptr(), 0 if offsets is None else offsets.data_ptr(),
                         out.data_ptr(), n_out, k_in, group_size)
        return out

    @staticmethod
    def _check_scales(name: str, scales: torch.Tensor, offsets: torch.Tensor | None) -> None:
        if scales.dtype != torch.float16 or (offsets is not None and offsets.dtype != torch.float16):
            raise ValueError(f"{name}: scales and offsets must be float16")

    def quantize_rows(self, x: torch.Tensor, block: int, row_absmax: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """float32 x [rows, K] rounded to int8 with one scale per `block` inputs: (xq, dx, sx),
        dx the scale and sx = dx * sum(xq) of each 32-input sub-block ([rows, K/32] float32).
        `row_absmax` [rows] (block = K): x is a row-parallel rank's share of rows with that absmax,
        rounded as the C code would round the whole rows (the same float32 steps)."""
        x = x.contiguous()
        rows, k_in = x.shape
        if row_absmax is not None:
            if block != k_in:
                raise ValueError(f"quantize_rows: a row's absmax needs one block a row, got {block} of {k_in}")
            d = (row_absmax.float() / 127).view(rows, 1)
            xq = torch.round(x * torch.where(d > 0, 1 / d, 0)).to(torch.int8)
            dx = d.expand(rows, k_in // 32).contiguous()
            return xq, dx, dx * xq.view(rows, -1, 32).sum(-1, dtype=torch.int32).float()
        xq = torch.empty(rows, k_in, dtype=torch.int8)
        dx = torch.empty(rows, k_in // 32)
        sx = torch.empty(rows, k_in // 32)
        self._quantize_rows(x.data_ptr(), rows, k_in, block, xq.data_ptr(), dx.data_ptr(), sx.data_ptr())
        return xq, dx, sx

    def quant_gemm_q8(self, x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                      offsets: torch.Tensor | None, group_size: int, act_block: int,
                      row_absmax: torch.Tensor | None = None) -> torch.Tensor:
        """x @ W^T in integer dot products: x (float32 [rows, K]) rounded to int8 per `act_block`
        inputs first (csrc/quant_gemm.cpp's int*_gemm_q8; shapes checked by the caller), or with
        one scale a row from `row_absmax` (see quantize_rows)."""
        rows, k_in = x.shape
        xq, dx, sx = self.quantize_rows(x, act_block, row_absmax)
        out = torch.empty(rows, qweight.shape[0], dtype=torch.float32)
        int8_gemm, int4_gemm = (self.amx if self.amx is not None and rows >= AMX_MIN_ROWS
                                else (self._int8_gemm_q8, self._int4_gemm_q8))
        if offsets is None:
            int8_gemm(xq.data_ptr(), dx.data_ptr(), sx.data_ptr(), qweight.data_ptr(), scales.data_ptr(),
                               out.data_ptr(), rows, qweight.shape[0], k_in, group_size)
        else:
            int4_gemm(xq.data_ptr(), dx.data_ptr(), sx.data_ptr(), qweight.data_ptr(), scales.data_ptr(),
                               offsets.data_ptr(), out.data_ptr(), rows, qweight.shape[0], k_in, group_size)
        return out


def _weight_buffer(numel: int, limit_bytes: int) -> torch.Tensor:
    """`numel` float32s of this thread's reused buffer (grown as needed), or a fresh tensor above
    `limit_bytes`."""
    if numel * 4 > limit_bytes:
        return torch.empty(numel)
    buffer: torch.Tensor | None = getattr(_REUSED, "buffer", None)
    if buffer is None or buffer.numel() < numel:
        buffer = _REUSED.buffer = torch.empty(numel)
    return buffer[:numel]


def cpu_kernels() -> CpuKernels | None:
    """The fused CPU steps, or None where the kernels cannot be built (layers then run PyTorch)."""
    try:
        return CpuKernels(load_kernels())
    except KernelBuildError:
        return None
