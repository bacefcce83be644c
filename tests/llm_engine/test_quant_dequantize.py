"""The native unpacking of whole quantized weights (prefill-sized matmuls): quantization.dequantize's
bits, so a prefill chunk computes what it computed before, only without the chain of torch ops."""

from __future__ import annotations

import pytest
import torch

from llm_engine.layers.linear import ReplicatedLinear
from llm_engine.layers.native import CpuKernels, cpu_kernels
from llm_engine.layers.quantization import (
    G32_KERNEL_MAX_ROWS,
    KERNEL_MAX_ROWS,
    QuantScheme,
    WeightOnlyLinearMethod,
    dequantize,
    pack_int4,
    quantize_fp8,
    quantize_int4,
    quantize_int8,
)


@pytest.fixture(scope="module")
def kernels() -> CpuKernels:
    found = cpu_kernels()
    assert found is not None, "the native kernels must build here"
    return found


# K a multiple of the group, a short last group, one group per channel, an odd channel count
SHAPES = [(37, 320, 32), (5, 300, 64), (8, 100, 100), (64, 576, 128)]


@pytest.mark.parametrize("n_out,k_in,group", SHAPES)
@pytest.mark.parametrize("kind", ["int8", "int4 sym", "int4 asym", "fp8"])
def test_native_dequantize_is_the_torch_dequantize_bit_for_bit(kernels, kind, n_out, k_in, group):
    torch.manual_seed(0)
    weight = torch.randn(n_out, k_in) * 0.05
    offsets = None
    if kind == "int8":
        qweight, scales = quantize_int8(weight, group)
    elif kind == "fp8":
        qweight, scales = quantize_fp8(weight, group, per_tensor=False)
    else:
        codes, scales, offsets = quantize_int4(weight, group, symmetric=kind == "int4 sym")
        qweight = pack_int4(codes, group)
    expected = dequantize(qweight, scales, offsets, group)
    assert torch.equal(kernels.dequantize(qweight, scales, offsets, group), expected)


def test_reused_buffer_serves_one_matmul_at_a_time_and_large_weights_get_their_own(kernels, monkeypatch):
    torch.manual_seed(0)
    small, big = (quantize_int8(torch.randn(n, 64), 32) for n in (4, 16))
    first = kernels.dequantize(*small, None, 32)
    expected_first = first.clone()
    second = kernels.dequantize(*big, None, 32)  # grows the buffer: `first` is no longer read
    assert torch.equal(second, dequantize(*big, None, 32))
    assert torch.equal(kernels.dequantize(*small, None, 32), expected_first)
    monkeypatch.setattr(CpuKernels, "REUSED_BYTES", 16 * 64 * 4 - 1)
    own = kernels.dequantize(*big, None, 32)
    assert own.data_ptr() != kernels.dequantize(*small, None, 32).data_ptr()
    assert torch.equal(own, dequantize(*big, None, 32))


def quantized_linear(scheme: QuantScheme, k_in: int = 320, n_out: int = 48) -> ReplicatedLinear:
    torch.manual_seed(0)
    layer = ReplicatedLinear(k_in, n_out, bias=False, quant_method=WeightOnlyLinearMethod(scheme))
    layer.weight.data.copy_(torch.randn(n_out, k_in) * 0.05)
    layer.quant_method.process_weights_after_loading(layer)
    return layer


@pytest.mark.parametrize(("scheme", "rows"), [(QuantScheme("int4", 32, False), G32_KERNEL_MAX_ROWS + 7),
                                              (QuantScheme("int4", 64, False), KERNEL_MAX_ROWS + 7)],
                         ids=["g32", "g64"])
def test_prefill_sized_inputs_multiply_with_the_dequantized_weight(kernels, scheme, rows):
    """More rows than the few-row kernel takes: F.linear with exactly the dequantized weight."""
    layer = quantized_linear(scheme)
    x = torch.randn(rows, 320)
    weight = dequantize(layer.qweight, layer.scales, layer.offsets, scheme.group_size)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, weight))


# groups per channel: one; ten (a part of the AVX-512 path's 16); 17 (16, then one without a pair); 33
@pytest.mark.parametrize("k_in", [32, 320, 544, 1056])
@pytest.mark.parametrize("scheme", [QuantScheme("int4", 32, False), QuantScheme("int8", 32)], ids=QuantScheme.describe)
def test_decode_batches_of_32_input_groups_stay_on_the_kernel_row_by_row(kernels, scheme, k_in):
    """A batched decode step of up to 64 sequences on GGUF-shaped groups: every row is what that
    sequence alone computes (the kernel, not a dequantized matmul with another summation order)."""
    layer = quantized_linear(scheme, k_in)
    x = torch.randn(G32_KERNEL_MAX_ROWS, k_in)
    batched = layer(x)
    assert all(torch.equal(batched[r], layer(x[r:r + 1])[0]) for r in range(0, G32_KERNEL_MAX_ROWS, 7))
    weight = dequantize(layer.qweight, layer.scales, getattr(layer, "offsets", None), 32)
    assert not torch.equal(batched, torch.nn.functional.linear(x, weight))  # it is not the dequantized path
    torch.testing.assert_close(batched, torch.nn.functional.linear(x, weight), atol=2e-4, rtol=1e-4)
