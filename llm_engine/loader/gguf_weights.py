"""Read a GGUF file's tensors as Hugging Face-named torch tensors.

Tensors named in `keep` stay quantized: their Q4_0/Q4_1/Q8_0 blocks are split into the engine's
int4/int8 layout (`qweight`, `scales`, `offsets`; see layers/csrc/quant_gemm.cpp), whose int4
byte order is the blocks' own, so no float copy is made. K-quants are repacked: Q4_K's 32-weight
sub-blocks become int4 g32 groups (nibbles reordered; scale d*sc and offset -dmin*m rounded to
float16, the layout's scale type), Q6_K's 16-weight sub-blocks int8 g16 (q - 32, scale d*sc).
Everything else is dequantized to float32. llama.cpp's converter permutes the rows of Llama's q/k projections for its rotary
layout; they are permuted back here (block rows are weight rows) so the weights match the
Hugging Face checkpoint exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Set
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from llm_engine.layers.quantization import pack_int4

_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_PERMUTED_ARCHS = {"llama"}
KEPT_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K")  # block types split_blocks keeps quantized  # Mistral GGUFs also use the llama architecture


def hf_name(gguf_name: str) -> str:
    base, _, suffix = gguf_name.rpartition(".")
    match = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if match and match.group(2) in _LAYER_NAMES:
        return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}.{suffix}"
    if base in _TOP_NAMES:
        return f"{_TOP_NAMES[base]}.{suffix}"
    raise ValueError(f"model: GGUF tensor {gguf_name!r} has no known Hugging Face name")


def unpermute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Invert llama.cpp's per-head interleaving of the rotary halves."""
    head_dim_half = weight.shape[0] // num_heads // 2
    return (weight.reshape(num_heads, head_dim_half, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def tensor_types(reader: GGUFReader) -> dict[str, str]:
    """{Hugging Face name: GGML block type name} of every tensor in the file."""
    return {hf_name(t.name): t.tensor_type.name for t in reader.tensors}


def split_blocks(blocks: np.ndarray, kind: GGMLQuantizationType) -> dict[str, torch.Tensor]:
    """Q4_0/Q4_1/Q8_0/Q4_K/Q6_K rows of raw blocks [N, bytes] -> qweight, float16 scales (and
    int4 offsets), with w = q * scale + offset per group. Q4_0: w = d (q - 8); Q4_1: w = d q + m;
    Q8_0: w = d q."""
    rows = blocks.shape[0]
    if kind == GGMLQuantizationType.Q4_K:
        return _split_q4_k(blocks)
    if kind == GGMLQuantizationType.Q6_K:
        return _split_q6_k(blocks)
    if kind == GGMLQuantizationType.Q8_0:
        b = blocks.reshape(rows, -1, 34)
        return {"qweight": torch.from_numpy(b[..., 2:].reshape(rows, -1).view(np.int8).copy()),
                "scales": torch.from_numpy(b[..., :2].copy().view(np.float16)[..., 0])}
    size = 18 if kind == GGMLQuantizationType.Q4_0 else 20
    b = blocks.reshape(rows, -1, size)
    d = b[..., :2].copy().view(np.float16)[..., 0]
    offsets = -8 * d if size == 18 else b[..., 2:4].copy().view(np.float16)[..., 0]  # -8d: exact in f16
    return {"qweight": torch.from_numpy(b[..., size - 16:].reshape(rows, -1).copy()),
            "scales": torch.from_numpy(d), "offsets": torch.from_numpy(np.ascontiguousarray(offsets))}


def _split_q4_k(blocks: np.ndarray) -> dict[str, torch.Tensor]:
    """Q4_K super-blocks (d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles: each
    32 bytes hold sub-block 2j in the low and 2j+1 in the high nibbles) -> int4 g32."""
    from gguf.quants import Q4_K

    rows = blocks.shape[0]
    b = blocks.reshape(-1, 144)
    d, dmin = (b[:, i:i + 2].copy().view(np.float16).astype(np.float32) for i in (0, 2))
    sc, mins = Q4_K.get_scale_min(b[:, 4:16])
    codes = (b[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 15
    return {"qweight": pack_int4(torch.from_numpy(codes.reshape(rows, -1)), 32),
            "scales": torch.from_numpy((d * sc).astype(np.float16).reshape(rows, -1)),
            "offsets": torch.from_numpy((-dmin * mins).astype(np.float16).reshape(rows, -1))}


def _split_q6_k(blocks: np.ndarray) -> dict[str, torch.Tensor]:
    """Q6_K super-blocks (128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, d)
    -> int8 g16 with q - 32 in [-32, 31]."""
    rows = blocks.shape[0]
    b = blocks.reshape(-1, 210)
    low = (b[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 15
    high = (b[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
    q = (low.reshape(-1, 2, 128) | (high.reshape(-1, 2, 128) << 4)).astype(np.int8) - np.int8(32)
    d = b[:, 208:210].copy().view(np.float16).astype(np.float32)
    scales = d * b[:, 192:208].view(np.int8).astype(np.float32)
    return {"qweight": torch.from_numpy(q.reshape(rows, -1)),
            "scales": torch.from_numpy(scales.astype(np.float16).reshape(rows, -1))}


def iter_gguf(reader: GGUFReader, config: Any, keep: Set[str] = frozenset()) -> Iterator[tuple[str, torch.Tensor]]:
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    num_heads = config.num_attention_heads
    num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        kept = name in keep
        if kept and tensor.tensor_type.name not in KEPT_TYPES:
            raise ValueError(f"model: GGUF block type {tensor.tensor_type.name} of {tensor.name} cannot be kept quantized")
        weight = np.asarray(tensor.data) if kept else dequantize(tensor.data, tensor.tensor_type)
        if arch in _PERMUTED_ARCHS and ".attn_q." in tensor.name:
            weight = unpermute_rows(weight, num_heads)
        elif arch in _PERMUTED_ARCHS and ".attn_k." in tensor.name:
            weight = unpermute_rows(weight, num_kv_heads)
        if kept:
            base = name.removesuffix(".weight")
            for part, value in split_blocks(weight, tensor.tensor_type).items():
                yield f"{base}.{part}", value
        else:
            yield name, torch.from_numpy(np.array(weight, dtype=np.float32))
