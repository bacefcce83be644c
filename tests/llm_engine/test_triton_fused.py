"""The Triton RMSNorm(+residual), rotary and SiLU * up kernels against the layers' own PyTorch code,
on CPU tensors in Triton's interpreter (on the GPU where there is one): odd widths, GQA heads, q and
k as views into a fused qkv row, both activation dtypes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_interpret import DEVICES, assert_close_to_reference

from llm_engine.kernels import fused, switch
from llm_engine.kernels.switch import use_triton
from llm_engine.layers.norm import RMSNorm
from llm_engine.layers.rotary import RotaryEmbedding

DTYPES = [torch.float32, torch.bfloat16]


def reference_norm(hidden: int, dtype: torch.dtype) -> RMSNorm:
    norm = RMSNorm(hidden, 1e-5, dtype)
    norm.weight.data = torch.randn(hidden).to(dtype)
    norm.kernels = None  # the PyTorch code
    return norm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(1, 64), (7, 67)])
def test_rms_norm_and_the_fused_residual_add_match_the_layer(device, dtype, rows, hidden):
    torch.manual_seed(rows)
    norm = reference_norm(hidden, dtype)
    x, residual = torch.randn(rows, hidden).to(dtype), torch.randn(rows, hidden).to(dtype)
    weight = norm.weight.to(device)
    assert_close_to_reference(fused.rms_norm(x.to(device), weight, norm.eps), norm(x))
    expected, expected_residual = norm(x, residual.clone())
    on_device = residual.to(device)
    out, new_residual = fused.fused_add_rms_norm(x.to(device), on_device, weight, norm.eps)
    assert new_residual is on_device  # updated in place, as vLLM's fused_add_rms_norm
    assert_close_to_reference(out, expected)
    assert_close_to_reference(new_residual, expected_residual)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,heads,kv_heads,rotary_dim", [(16, 4, 2, 16), (10, 3, 1, 10), (16, 4, 2, 6)])
def test_rotary_rotates_q_and_k_in_place_inside_the_fused_qkv_output(device, dtype, head_dim, heads, kv_heads,
                                                                      rotary_dim):
    """GQA; MQA with half 5; partial rotary (the first 6 dims of each head)."""
    torch.manual_seed(head_dim)
    rotary = RotaryEmbedding(rotary_dim, 64, {"rope_theta": 10000.0})
    rotary.kernels = None
    tokens = 7
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim).to(dtype)
    positions = torch.tensor([0, 63, 5, 5, 31, 1, 62])  # per token, repeats and both table ends
    sizes = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    q, k, _ = qkv.split(sizes, dim=-1)
    expected_q, expected_k = rotary(positions, q.reshape(tokens, heads, head_dim), k.reshape(tokens, kv_heads, head_dim))

    on_device = qkv.to(device)
    q, k, v = on_device.split(sizes, dim=-1)
    fused.rotary_embedding(positions.to(device), q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim),
                           rotary.cos.to(device), rotary.sin.to(device))
    assert_close_to_reference(q.reshape(tokens, heads, head_dim), expected_q)
    assert_close_to_reference(k.reshape(tokens, kv_heads, head_dim), expected_k)
    assert torch.equal(v.cpu(), qkv.split(sizes, dim=-1)[2])  # v untouched


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 2, 74), (1, 2 * (fused.SILU_BLOCK + 5))])  # odd width; two column blocks
def test_silu_and_mul_matches_torch(device, dtype, shape):
    torch.manual_seed(shape[-1])
    x = (torch.randn(shape) * 4).to(dtype)
    gate, up = x.chunk(2, dim=-1)
    out = fused.silu_and_mul(x.to(device))
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == dtype
    assert_close_to_reference(out, F.silu(gate) * up)


def test_the_cpu_switch_needs_the_interpreter(monkeypatch):
    x = torch.zeros(2)
    assert not use_triton(x)  # the CPU path by default
    monkeypatch.setattr(switch, "on_cpu", True)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        use_triton(x)


def test_mismatched_shapes_are_clear_errors():
    with pytest.raises(ValueError, match="residual"):
        fused.fused_add_rms_norm(torch.zeros(2, 8), torch.zeros(2, 16)[:, :8], torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match="rotary"):
        fused.rotary_embedding(torch.zeros(1, dtype=torch.long), torch.zeros(1, 2, 8), torch.zeros(1, 1, 6),
                               torch.zeros(4, 4), torch.zeros(4, 4))
