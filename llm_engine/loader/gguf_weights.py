"""Read a GGUF file's tensors as Hugging Face-named torch tensors (dequantized to float32).

llama.cpp's converter permutes the rows of Llama's q/k projections for its rotary layout; they are
permuted back here so the weights match the Hugging Face checkpoint exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_PERMUTED_ARCHS = {"llama"}  # Mistral GGUFs also use the llama architecture


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


def iter_gguf(path: Path, config) -> Iterator[tuple[str, torch.Tensor]]:
    reader = GGUFReader(str(path))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    num_heads = config.num_attention_heads
    num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
    for tensor in reader.tensors:
        weight = dequantize(tensor.data, tensor.tensor_type)
        if arch in _PERMUTED_ARCHS and ".attn_q." in tensor.name:
            weight = unpermute_rows(weight, num_heads)
        elif arch in _PERMUTED_ARCHS and ".attn_k." in tensor.name:
            weight = unpermute_rows(weight, num_kv_heads)
        yield hf_name(tensor.name), torch.from_numpy(np.array(weight, dtype=np.float32))
