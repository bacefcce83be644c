"""The native fused RMSNorm, rotary and SiLU * up against the PyTorch code they replace."""

from __future__ import annotations

import pytest
import torch

from llm_engine.layers import native
from llm_engine.layers.activation import SiluAndMul
from llm_engine.layers.norm import RMSNorm
from llm_engine.layers.rotary import RotaryEmbedding

DTYPES = [torch.float32, torch.bfloat16]


def reference(module: torch.nn.Module) -> torch.nn.Module:
    """The same layer on its PyTorch path."""
    module.kernels = None
    return module


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [576, 72])  # 72: a tail shorter than one 16-wide vector
def test_rms_norm_matches_torch_with_and_without_residual(dtype, hidden):
    norm = RMSNorm(hidden, 1e-5, dtype)
    assert norm.kernels is not None
    norm.weight.data = torch.randn(hidden, dtype=dtype)
    ref = reference(RMSNorm(hidden, 1e-5, dtype))
    ref.weight = norm.weight
    x, residual = torch.randn(37, hidden, dtype=dtype), torch.randn(37, hidden, dtype=dtype)

    torch.testing.assert_close(norm(x), ref(x))
    expected, expected_residual = ref(x, residual.clone())
    in_place = residual.clone()
    got, got_residual = norm(x, in_place)
    torch.testing.assert_close(got, expected)
    assert torch.equal(got_residual, expected_residual)  # the same add and rounding
    assert got_residual.data_ptr() == in_place.data_ptr()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (24, 24), (96, 48)])  # 48: partial rotary
def test_rotary_in_place_on_fused_qkv_is_bitwise_torch(dtype, head_dim, rotary_dim):
    heads, kv_heads = 9, 3
    rotary = RotaryEmbedding(rotary_dim, 1024, {"rope_theta": 10000.0})
    ref = reference(RotaryEmbedding(rotary_dim, 1024, {"rope_theta": 10000.0}))
    qkv = torch.randn(21, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    positions = torch.randint(0, 1024, (21,))

    def q_and_k(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, _ = t.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        return q.view(-1, heads, head_dim), k.view(-1, kv_heads, head_dim)

    expected_q, expected_k = ref(positions, *q_and_k(qkv.clone()))
    fused = qkv.clone()
    got_q, got_k = rotary(positions, *q_and_k(fused))
    assert torch.equal(got_q, expected_q) and torch.equal(got_k, expected_k)
    assert torch.equal(q_and_k(fused)[0], expected_q)  # rotated where it lies
    assert torch.equal(fused[:, -kv_heads * head_dim:], qkv[:, -kv_heads * head_dim:])  # v untouched
    for got, source in zip(q_and_k(fused), q_and_k(qkv)):  # past rotary_dim, each head as it was
        assert torch.equal(got[..., rotary_dim:], source[..., rotary_dim:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1536, 40])
def test_silu_and_mul_matches_torch(dtype, width):
    x = torch.randn(13, 2 * width, dtype=dtype) * 4
    got = SiluAndMul()(x)
    assert got.shape == (13, width)
    torch.testing.assert_close(got, reference(SiluAndMul())(x))


def test_without_a_compiler_the_layers_run_pytorch(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", "/bin/false")
    monkeypatch.setenv("CODEYARD_KERNEL_CACHE", str(tmp_path))
    native.load_kernels.cache_clear()
    try:
        norm = RMSNorm(8, 1e-6)
        assert norm.kernels is None
        x = torch.randn(3, 8)
        torch.testing.assert_close(norm(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    finally:
        native.load_kernels.cache_clear()
