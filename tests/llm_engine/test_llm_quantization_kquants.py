"""GGUF Q4_K and Q6_K super-blocks repacked into the int4 g32 / int8 g16 layouts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import int4_kernel_activations
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from llm_engine.layers.linear import ReplicatedLinear
from llm_engine.layers.quant_config import GGUF_SCHEMES
from llm_engine.layers.quantization import WeightOnlyLinearMethod, dequantize
from llm_engine.loader.gguf_weights import split_blocks


def random_blocks(kind: str, rows: int, k_in: int, seed: int = 0) -> np.ndarray:
    """Raw super-blocks with random payload bytes and finite float16 d (and dmin)."""
    rng = np.random.default_rng(seed)
    size = {"Q4_K": 144, "Q6_K": 210}[kind]
    b = rng.integers(0, 256, (rows * k_in // 256, size), dtype=np.uint8)
    d = (rng.random(len(b)) * 0.01 + 0.001).astype(np.float16).view(np.uint8).reshape(-1, 2)
    if kind == "Q4_K":
        b[:, 0:2] = d
        b[:, 2:4] = (rng.random(len(b)) * 0.01).astype(np.float16).view(np.uint8).reshape(-1, 2)
    else:
        b[:, 208:210] = d
    return b.reshape(rows, -1)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_k_quant_repack_dequantizes_like_gguf(kind):
    """Codes move without change; only d*sc (and dmin*m) round to float16: within 2^-11 of a scale."""
    rows, k_in = 6, 512
    blocks = random_blocks(kind, rows, k_in)
    scheme = GGUF_SCHEMES[kind]
    parts = split_blocks(blocks, GGMLQuantizationType[kind])
    assert parts["qweight"].shape == (rows, k_in // 2 if scheme.weights == "int4" else k_in)
    assert parts["scales"].shape == (rows, k_in // scheme.group_size)
    ours = dequantize(parts["qweight"], parts["scales"], parts.get("offsets"), scheme.group_size)
    reference = torch.from_numpy(gguf_dequantize(blocks, GGMLQuantizationType[kind]).astype(np.float32))
    steps = parts["scales"].float().abs().repeat_interleave(scheme.group_size, 1)
    bound = steps * 2 ** -11 * (16 if kind == "Q4_K" else 32) + 0.01 * 2 ** -11 * 63 + 1e-7
    assert bool(((ours - reference).abs() <= bound).all())


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_k_quant_layers_multiply_in_the_kernel(kind):
    rows, k_in = 40, 512
    blocks = random_blocks(kind, rows, k_in, seed=1)
    layer = ReplicatedLinear(k_in, rows, quant_method=WeightOnlyLinearMethod(GGUF_SCHEMES[kind], prequantized=True))
    for name, value in split_blocks(blocks, GGMLQuantizationType[kind]).items():
        getattr(layer, name).weight_loader(getattr(layer, name), value)
    layer.quant_method.process_weights_after_loading(layer)
    reference = torch.from_numpy(gguf_dequantize(blocks, GGMLQuantizationType[kind]).astype(np.float32))
    x = torch.randn(3, k_in)
    ours = dequantize(layer.qweight, layer.scales, getattr(layer, "offsets", None), GGUF_SCHEMES[kind].group_size)
    seen = int4_kernel_activations(x) if kind == "Q4_K" else x  # Q4_K: int4 g32, Q6_K: int8 g16
    torch.testing.assert_close(layer(x), (seen.double() @ ours.double().t()).float(), atol=1e-3, rtol=1e-4)
    gguf_out = x @ reference.t()  # differs by the float16 rounding of the scales only
    assert (layer(x) - gguf_out).abs().max() <= 1e-3 * gguf_out.abs().max()
