"""x @ W^T for the engine's packed weights in Triton, dequantized inside the GEMM's K loop (each
weight tile is widened in registers right before its dot product; no float copy of W exists).

The layouts are `layers/quantization.py`'s (AWQ and GPTQ checkpoints are repacked into them at
load, `layers/quantization_formats.py`), all with float16 scales [N, groups]:
  int4: uint8 qweight [N, K/2], w = q * scale + offset (offsets [N, groups]); in each group of L
        inputs (the last may be shorter) byte j holds input j in its low nibble and j + L/2 in its
        high one. The loop walks a group's bytes once and takes two dots per tile: the low nibbles
        with the activations of the group's first half, the high ones with its second half.
  int8: int8 qweight [N, K], w = q * scale (per output channel: one group of K).
  fp8:  float8 E4M3 qweight [N, K], w = q * scale.
The reference is layers/quantization.py's: dequantize in float32, round W to the activations'
dtype, multiply with float32 accumulation (the dots here take bf16/fp16 operands on the GPU and
float32 ones in the interpreter, which has no bf16 dot; float32 activations take IEEE float32
dots, not TF32).

FP8 on a GPU with FP8 matrix units (compute capability 8.9+): `torch._scaled_mm` with the
activations rounded to float8 too (one scale per tensor, vLLM's dynamic per-tensor scheme) and
the weight's per-channel scales applied to its float32 output; that changes results by the
activations' rounding, as vLLM's FP8 path does. Group-wise fp8 scales and sizes it cannot take
(K, N not multiples of 16) use the Triton kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llm_engine.kernels.autotune import Autotuner, shape_bucket

FP8_MAX = 448.0


# Kernel parameters stay unannotated: Triton reads annotations as Triton types (and ships no hints).
@triton.jit  # type: ignore[untyped-decorator]
def _quant_gemm_kernel(  # type: ignore[no-untyped-def]
        x_ptr, w_ptr, scales_ptr, offsets_ptr, bias_ptr, out_ptr, M, N, K, group, num_groups, x_stride, w_stride,
        out_stride, split_stride, INT4: tl.constexpr, HAS_OFFSETS: tl.constexpr, HAS_BIAS: tl.constexpr,
        DOT_DTYPE: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(2)  # with SPLIT_K > 1 this program takes every SPLIT_K-th group from `split`
    row_mask = rows < M
    col_mask = cols < N
    kk = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * x_stride
    w_cols = w_ptr + cols.to(tl.int64)[None, :] * w_stride
    w_dtype = x_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g in range(split, num_groups, SPLIT_K):
        start = g * group
        length = tl.minimum(group, K - start)
        scale = tl.load(scales_ptr + cols * num_groups + g, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        if HAS_OFFSETS:
            offset = tl.load(offsets_ptr + cols * num_groups + g, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        else:
            offset = tl.zeros((1, BLOCK_N), dtype=tl.float32)
        if INT4:
            half = length // 2
            for chunk in range(0, half, BLOCK_K):
                j = chunk + kk
                j_mask = j < half
                packed = tl.load(w_cols + (start // 2 + j)[:, None], mask=j_mask[:, None] & col_mask[None, :], other=0)
                low = ((packed & 15).to(tl.float32) * scale + offset).to(w_dtype).to(DOT_DTYPE)
                high = ((packed >> 4).to(tl.float32) * scale + offset).to(w_dtype).to(DOT_DTYPE)
                x_mask = row_mask[:, None] & j_mask[None, :]
                x_low = tl.load(x_rows + (start + j)[None, :], mask=x_mask, other=0.0).to(DOT_DTYPE)
                x_high = tl.load(x_rows + (start + half + j)[None, :], mask=x_mask, other=0.0).to(DOT_DTYPE)
                if IEEE:
                    acc = tl.dot(x_low, low, acc, input_precision="ieee")
                    acc = tl.dot(x_high, high, acc, input_precision="ieee")
                else:
                    acc = tl.dot(x_low, low, acc)
                    acc = tl.dot(x_high, high, acc)
        else:
            for chunk in range(0, length, BLOCK_K):
                j = chunk + kk
                j_mask = j < length
                w_mask = j_mask[:, None] & col_mask[None, :]
                q = tl.load(w_cols + (start + j)[:, None], mask=w_mask)  # no `other`: float8 takes no literal
                w = tl.where(w_mask, q.to(tl.float32) * scale + offset, 0.0).to(w_dtype).to(DOT_DTYPE)
                x = tl.load(x_rows + (start + j)[None, :], mask=row_mask[:, None] & j_mask[None, :],
                            other=0.0).to(DOT_DTYPE)
                if IEEE:
                    acc = tl.dot(x, w, acc, input_precision="ieee")
                else:
                    acc = tl.dot(x, w, acc)
    if HAS_BIAS:
        if split == 0:
            acc += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + split * split_stride + rows.to(tl.int64)[:, None] * out_stride + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


# BLOCK_M, BLOCK_N, warps and SPLIT_K (default 1); BLOCK_K follows the group (see _block_k). The
# first is what the interpreter and untuned devices use. Split-K is for decode-sized M: N / BLOCK_N
# programs alone leave most of a large GPU idle while the weight streams through; each split sums
# its share of the groups into a float32 partial, and the partials are added after.
_TUNER = Autotuner("quant_gemm", [
    {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4},
    {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4},
    {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "SPLIT_K": 4},
    {"BLOCK_M": 16, "BLOCK_N": 128, "num_warps": 4, "SPLIT_K": 8},
    {"BLOCK_M": 16, "BLOCK_N": 128, "num_warps": 4},
    {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4},
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4},
    {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 8},
    {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8},
])
_DOT_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def _block_k(span: int) -> int:
    """Inputs per K step: the span one group's loop walks (half a group for int4), as a power of
    two between 16 (the dot's minimum) and 64."""
    return max(16, min(64, int(triton.next_power_of_2(span))))


def _gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None,
          group_size: int, bias: torch.Tensor | None) -> torch.Tensor:
    if x.dtype not in _DOT_DTYPES:
        raise ValueError(f"quant_gemm: activations must be float32, float16 or bfloat16, got {x.dtype}")
    int4 = qweight.dtype == torch.uint8
    k_in = x.shape[-1]
    n_out = qweight.shape[0]
    num_groups = -(-k_in // group_size)
    if qweight.shape[1] != (k_in // 2 if int4 else k_in) or scales.shape != (n_out, num_groups):
        raise ValueError(f"quant_gemm: a {tuple(qweight.shape)} {qweight.dtype} weight with scales "
                         f"{tuple(scales.shape)} does not take {k_in} inputs in groups of {group_size}")
    if int4 and (offsets is None or k_in % 2 or group_size % 2):
        raise ValueError("quant_gemm: int4 needs offsets and even input and group sizes")
    rows = x.reshape(-1, k_in)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    qweight, scales = qweight.contiguous(), scales.contiguous()
    offsets = offsets.contiguous() if offsets is not None else None
    out = torch.empty(rows.shape[0], n_out, dtype=x.dtype, device=x.device)
    if rows.shape[0] == 0:
        return out.view(*x.shape[:-1], n_out)
    # The interpreter has no bf16/fp16 dot: there the operands widen to float32 (exactly).
    dot_dtype = _DOT_DTYPES[x.dtype] if x.is_cuda else tl.float32
    block_k = _block_k(group_size // 2 if int4 else group_size)

    def launch(config: dict[str, int]) -> None:
        split = min(config.get("SPLIT_K", 1), num_groups)
        target = out if split == 1 else torch.empty(split, *out.shape, dtype=torch.float32, device=x.device)
        grid = (triton.cdiv(rows.shape[0], config["BLOCK_M"]), triton.cdiv(n_out, config["BLOCK_N"]), split)
        _quant_gemm_kernel[grid](
            rows, qweight, scales, offsets if offsets is not None else scales, bias if bias is not None else scales,
            target, rows.shape[0], n_out, k_in, group_size, num_groups, rows.stride(0), qweight.stride(0),
            out.stride(0), target.stride(0) if split > 1 else 0, INT4=int4, HAS_OFFSETS=offsets is not None,
            HAS_BIAS=bias is not None, DOT_DTYPE=dot_dtype, IEEE=dot_dtype == tl.float32, BLOCK_M=config["BLOCK_M"],
            BLOCK_N=config["BLOCK_N"], BLOCK_K=block_k, SPLIT_K=split, num_warps=config["num_warps"])
        if split > 1:
            out.copy_(target.sum(0))

    key = (str(qweight.dtype), str(x.dtype), n_out, k_in, group_size, shape_bucket(rows.shape[0]))
    launch(_TUNER.pick(key, launch, x.device))
    return out.view(*x.shape[:-1], n_out)


def _expect(qweight: torch.Tensor, dtype: torch.dtype) -> None:
    if qweight.dtype != dtype:
        raise ValueError(f"quant_gemm: this GEMM reads {dtype} weights, got {qweight.dtype}")


def int4_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor,
              group_size: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ W^T (+ bias) for the engine's int4 layout (symmetric weights have offsets -8 * scale)."""
    _expect(qweight, torch.uint8)
    return _gemm(x, qweight, scales, offsets, group_size, bias)


def int8_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ W^T (+ bias) for int8 weights (group_size K: per output channel)."""
    _expect(qweight, torch.int8)
    return _gemm(x, qweight, scales, None, group_size, bias)


def fp8_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int,
             bias: torch.Tensor | None = None, scaled_mm: bool | None = None) -> torch.Tensor:
    """x [..., K] @ W^T (+ bias) for float8 E4M3 weights. `scaled_mm`: through torch._scaled_mm
    (activations rounded to float8); None: where the device has FP8 matrix units and the shapes fit."""
    _expect(qweight, torch.float8_e4m3fn)
    if scaled_mm is None:
        scaled_mm = scaled_mm_fits(x, qweight, scales)
    if not scaled_mm:
        return _gemm(x, qweight, scales, None, group_size, bias)
    if scales.shape[1] != 1:
        raise ValueError("fp8_gemm: torch._scaled_mm takes one scale per output channel, not per group")
    rows = x.reshape(-1, x.shape[-1])
    x_scale = (rows.abs().amax().float() / FP8_MAX).clamp(min=1e-12)
    x_fp8 = (rows.float() / x_scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    out = torch._scaled_mm(x_fp8, qweight.t(), scale_a=x_scale, scale_b=torch.ones((), device=x.device),
                           out_dtype=torch.float32)
    out = out * scales.float().view(1, -1)
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).view(*x.shape[:-1], -1)


def scaled_mm_fits(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> bool:
    """Whether fp8_gemm takes torch._scaled_mm: a GPU with FP8 matrix units (compute capability
    8.9+), per-channel scales, and K and N multiples of 16 (its tile)."""
    if not x.is_cuda or scales.shape[1] != 1 or x.shape[-1] % 16 or qweight.shape[0] % 16:
        return False
    return torch.cuda.get_device_capability(x.device) >= (8, 9)


def quant_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None,
               group_size: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The GEMM for a weight in any of the engine's layouts, told apart by qweight's dtype (what
    the quantized linear layers call on CUDA)."""
    if qweight.dtype == torch.float8_e4m3fn:
        return fp8_gemm(x, qweight, scales, group_size, bias)
    return _gemm(x, qweight, scales, offsets, group_size, bias)
