"""The native unpacking of whole quantized weights (prefill-sized matmuls): quantization.dequantize's
bits, so a prefill chunk computes what it computed before, only without the chain of torch ops."""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import int4_kernel_activations, int4_rounds_activations

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


def test_a_dequantized_weight_is_the_callers_own(kernels):
    """`dequantize` and `dequantize_bf16` hand back tensors no later call overwrites (another
    layer's kernels included): only `dequantized_linear` dequantizes into the shared buffer."""
    torch.manual_seed(0)
    small, big = (quantize_int8(torch.randn(n, 64), 32) for n in (4, 16))
    first = kernels.dequantize(*small, None, 32)
    kernels.dequantize(*big, None, 32)
    cpu_kernels().dequantized_linear(torch.randn(3, 64), *big, None, 32)  # type: ignore[union-attr]
    assert torch.equal(first, dequantize(*small, None, 32))
    if kernels.bf16_dequantizes(small[0], None, 32):
        first_bf16 = kernels.dequantize_bf16(*small, None, 32)
        kernels.dequantized_linear(torch.randn(3, 64, dtype=torch.bfloat16), *big, None, 32)
        assert torch.equal(first_bf16, dequantize(*small, None, 32).bfloat16())


def linear_weights(monkeypatch) -> list[torch.Tensor]:
    """The weights F.linear is called with from now on."""
    seen: list[torch.Tensor] = []
    linear = torch.nn.functional.linear

    def noted(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        seen.append(weight)
        return linear(x, weight, bias)
    monkeypatch.setattr(torch.nn.functional, "linear", noted)
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_matmuls_share_one_buffer_per_thread(kernels, monkeypatch, dtype):
    """Every layer's kernels (an instance per layer) dequantize into one buffer per thread, not
    one each; the result is F.linear with the dequantized weight bit for bit, bias included; a
    weight above REUSED_BYTES gets a tensor of its own."""
    torch.manual_seed(0)
    shapes = [(48, 64), (16, 64)]
    weights = [quantize_int4(torch.randn(n, k), 32, symmetric=False) for n, k in shapes]
    layers = [(pack_int4(codes, 32), scales, offsets) for codes, scales, offsets in weights]
    x, bias = torch.randn(5, 64).to(dtype), torch.randn(48).to(dtype)
    if dtype == torch.bfloat16 and not kernels.bf16_dequantizes(layers[0][0], layers[0][2], 32):
        pytest.skip("bfloat16 activations take the shared buffer where the AMX build dequantizes to bfloat16; "
                    "elsewhere the float32 weight is converted per call (and bfloat16 is not the default dtype)")
    seen = linear_weights(monkeypatch)
    other = cpu_kernels()
    assert other is not None and other is not kernels
    out = [kernels.dequantized_linear(x, *layers[0], 32, bias), other.dequantized_linear(x, *layers[1], 32)]
    assert seen[0].untyped_storage().data_ptr() == seen[1].untyped_storage().data_ptr()
    assert torch.equal(out[0], torch.nn.functional.linear(x, dequantize(*layers[0], 32).to(dtype), bias))
    assert torch.equal(out[1], torch.nn.functional.linear(x, dequantize(*layers[1], 32).to(dtype)))
    assert all(o.untyped_storage().data_ptr() != seen[0].untyped_storage().data_ptr() for o in out)

    def in_a_thread() -> None:  # compared with F.linear in that thread: a BLAS may block a new thread's work otherwise
        threads_own.append(other.dequantized_linear(x, *layers[0], 32, bias))
        threads_own.append(torch.nn.functional.linear(x, dequantize(*layers[0], 32).to(dtype), bias))

    threads_own: list[torch.Tensor] = []
    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert torch.equal(threads_own[0], threads_own[1])
    assert seen[-1].untyped_storage().data_ptr() != seen[0].untyped_storage().data_ptr()

    monkeypatch.setattr(CpuKernels, "REUSED_BYTES", 48 * 64 * 2 - 1)  # below the bf16 weight too
    assert torch.equal(kernels.dequantized_linear(x, *layers[0], 32, bias), out[0])
    assert seen[-1].untyped_storage().data_ptr() != seen[0].untyped_storage().data_ptr()


def test_threads_dequantizing_at_once_do_not_overwrite_each_other(kernels):
    """Each thread's buffer is its own: two threads multiplying different weights side by side
    each get their own weight's product, every time."""
    torch.manual_seed(0)
    layers = [(*quantize_int8(torch.randn(1024, 512) * (i + 1), 32), None) for i in range(2)]
    x = torch.randn(20, 512)
    expected = [torch.nn.functional.linear(x, dequantize(*layer, 32)) for layer in layers]
    wrong: list[int] = []

    def run(i: int) -> None:
        for _ in range(40):
            if not torch.equal(kernels.dequantized_linear(x, *layers[i], 32), expected[i]):
                wrong.append(i)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not wrong


def quantized_linear(scheme: QuantScheme, k_in: int = 320, n_out: int = 48) -> ReplicatedLinear:
    torch.manual_seed(0)
    layer = ReplicatedLinear(k_in, n_out, bias=False, quant_method=WeightOnlyLinearMethod(scheme))
    layer.weight.data.copy_(torch.randn(n_out, k_in) * 0.05)
    layer.quant_method.process_weights_after_loading(layer)
    return layer


@pytest.mark.parametrize("scheme", [QuantScheme("int4", 32, False), QuantScheme("int4", 64, False),
                                    QuantScheme("int8", 64)], ids=QuantScheme.describe)
def test_prefill_sized_inputs_multiply_with_the_dequantized_weight(kernels, scheme):
    """More rows than the few-row kernel takes: F.linear with exactly the dequantized weight."""
    layer = quantized_linear(scheme)
    rows = layer.quant_method.kernel_max_rows(layer) + 7
    # int4 groups of 64 stay on the kernel to 64 rows where it rounds activations to int16 (AVX2)
    assert rows == (G32_KERNEL_MAX_ROWS if scheme.group_size == 32 or (
        scheme.weights == "int4" and int4_rounds_activations()) else KERNEL_MAX_ROWS) + 7
    x = torch.randn(rows, 320)
    weight = dequantize(layer.qweight, layer.scales, getattr(layer, "offsets", None), scheme.group_size)
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
    seen = int4_kernel_activations(x) if scheme.method == "int4" else x
    torch.testing.assert_close(batched, torch.nn.functional.linear(seen, weight), atol=2e-4, rtol=1e-4)


# groups of 128 over 320 inputs: two, then a short one of 64 (a run of low nibbles, one of high)
@pytest.mark.parametrize("group", [32, 128])
def test_int4_rows_multiply_the_activations_the_kernel_says(kernels, group):
    """Float32 activations, or each 32 inputs rounded to int16 where `int4_activation_bits` says
    16 (AVX2 builds): a group whose outlier makes its step coarse shows which; a NaN still reaches
    every output of its row, and a row of zeros and a 1e-35 group gives (near) zeros."""
    layer = quantized_linear(QuantScheme("int4", group, False))
    weight = dequantize(layer.qweight, layer.scales, layer.offsets, group).double()
    x = torch.randn(4, 320) * 0.01
    x[:, ::32] = 1000.0  # per group one input at 1000: an int16 step of 0.03 swamps the others
    x[2] = 0.0
    x[2, 40:72] = 1e-35  # a group too small to scale counts as zeros (and overflows nothing)
    x[3, 5] = float("nan")
    out = layer(x).double()
    rounded = kernels.int4_activation_bits == 16
    assert rounded == int4_rounds_activations() and kernels.int4_activation_bits in (16, 32)
    torch.testing.assert_close(out[:3], int4_kernel_activations(x[:3]).double() @ weight.t(), atol=1e-3, rtol=1e-6)
    assert bool((out[2].abs() < 1e-30).all())
    assert bool(out[3].isnan().all())
    deviation = (out[:2] - x[:2].double() @ weight.t()).abs().max().item()
    assert deviation > 5e-3 if rounded else deviation < 1e-3


# int4 groups of a multiple of 64 (AWQ/GPTQ's and our int4's 128): K in whole groups; a short last
# group of 64 (one run of low nibbles, one of high) or of 32 (paired like GGUF's); groups of 64 and 256
@pytest.mark.parametrize(("k_in", "group"), [(1024, 128), (320, 128), (288, 128), (544, 64), (1280, 256)])
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_decode_batches_of_int4_groups_of_64_and_more_are_computed_row_by_row(kernels, k_in, group, symmetric):
    """Where the kernel rounds int4 activations to int16 (AVX2 builds) these groups take its few-row
    path up to 64 rows too, each 32-input sub-block's nibbles picked out of its group's layout; on
    AVX-512 builds (float activations) the table kernel's, up to the layer's 16 rows, 16 codes of
    a group's first half and the matching 16 of its second at a time. A row's result is then what
    it computes alone, F.linear of the activations the kernel multiplies."""
    layer = quantized_linear(QuantScheme("int4", group, symmetric), k_in)
    rows = layer.quant_method.kernel_max_rows(layer)
    assert rows == (G32_KERNEL_MAX_ROWS if int4_rounds_activations() else KERNEL_MAX_ROWS)
    x = torch.randn(rows, k_in)
    batched = layer(x)
    assert all(torch.equal(batched[r], layer(x[r:r + 1])[0]) for r in range(0, rows, 5))
    weight = dequantize(layer.qweight, layer.scales, layer.offsets, group)
    torch.testing.assert_close(batched, torch.nn.functional.linear(int4_kernel_activations(x), weight),
                               atol=2e-4, rtol=1e-4)


# per channel (the group is the row: the `int8` method's default, the 1B benchmark's tables), a
# group of 64 and of 96 (three 32s), over 544 inputs (a short last group of 32 or 64)
@pytest.mark.parametrize("group", [None, 64, 96], ids=["per-channel", "g64", "g96"])
def test_int8_decode_rows_of_any_32_multiple_groups_are_computed_row_by_row(kernels, group):
    """Decode rows of int8 weights in groups of a multiple of 32 inputs (on AVX-512 builds the
    table kernel's path since stop 38, each 32 codes widened once for all rows): every row is
    what it computes alone, and F.linear with the dequantized weight to float rounding."""
    layer = quantized_linear(QuantScheme("int8", group), 544)
    rows = layer.quant_method.kernel_max_rows(layer)
    x = torch.randn(rows, 544)
    batched = layer(x)
    assert all(torch.equal(batched[r], layer(x[r:r + 1])[0]) for r in range(rows))
    weight = dequantize(layer.qweight, layer.scales, None, group or 544)
    torch.testing.assert_close(batched, torch.nn.functional.linear(x, weight), atol=2e-4, rtol=1e-4)
