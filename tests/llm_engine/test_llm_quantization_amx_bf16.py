"""Weight-only int4/int8 layers with bfloat16 activations on AMX bf16 tiles
(csrc/quant_gemm_amx_bf16.cpp): batched rows multiply against the weights dequantized to bf16,
so results are F.linear(x, dequantize(W).bfloat16()) up to float summation order, and a row's
result does not depend on the rows beside it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llm_engine.layers import native
from llm_engine.layers.linear import ReplicatedLinear
from llm_engine.layers.quantization import (
    AMX_BF16_MAX_ROWS,
    AMX_BF16_MIN_DECODE_SEQUENCES,
    KERNEL_MAX_ROWS,
    QuantScheme,
    WeightOnlyLinearMethod,
    decode_step,
    dequantize,
)

KERNELS = native.cpu_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None or KERNELS.amx_bf16 is None,
                                reason="needs a CPU and a compiler with AMX bf16")
SCHEMES = [QuantScheme("int4", 32, False), QuantScheme("int4", 32, True), QuantScheme("int4", 64, False),
           QuantScheme("int4", 128, True), QuantScheme("int8"), QuantScheme("int8", 32)]


def bf16_layer(scheme: QuantScheme, k_in: int, n_out: int) -> tuple[ReplicatedLinear, torch.Tensor]:
    """A quantized layer and its weight as the tiles see it (dequantized, rounded to bf16)."""
    torch.manual_seed(0)
    layer = ReplicatedLinear(k_in, n_out, bias=True, quant_method=WeightOnlyLinearMethod(scheme),
                             dtype=torch.bfloat16)
    layer.weight.data.copy_(torch.randn(n_out, k_in) * 0.05)
    layer.bias.data.copy_(torch.randn(n_out))
    layer.quant_method.process_weights_after_loading(layer)
    offsets = getattr(layer, "offsets", None)
    return layer, dequantize(layer.qweight, layer.scales, offsets, scheme.group_size or k_in).bfloat16()


@pytest.mark.parametrize("scheme", SCHEMES, ids=QuantScheme.describe)
@pytest.mark.parametrize("rows", [2, 17, 33, 64])
def test_tiles_match_the_bf16_matmul_of_the_dequantized_weight(scheme, rows):
    """Odd channel counts, a shorter last group (320 = 2 x 128 + 64), a partial last row block."""
    layer, weight = bf16_layer(scheme, k_in=320, n_out=37)
    x = torch.randn(rows, 320).bfloat16()
    out = KERNELS.quant_gemm_bf16(x, layer.qweight, layer.scales, getattr(layer, "offsets", None),
                                  scheme.group_size or 320)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, 37)
    exact = x.double() @ weight.double().t()
    # float32 sums rounded once to bf16 (8 significant bits)
    torch.testing.assert_close(out.double(), exact, rtol=2 ** -8, atol=1e-3)


@pytest.mark.parametrize("scheme", [QuantScheme("int4", 32, False), QuantScheme("int8", 32)], ids=QuantScheme.describe)
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(scheme):
    layer, _ = bf16_layer(scheme, k_in=576, n_out=100)
    x = torch.randn(64, 576).bfloat16()
    args = (layer.qweight, layer.scales, getattr(layer, "offsets", None), 32)
    together = KERNELS.quant_gemm_bf16(x, *args)
    for lo, hi in [(0, 1), (5, 22), (40, 64)]:
        assert torch.equal(KERNELS.quant_gemm_bf16(x[lo:hi], *args), together[lo:hi])


@pytest.mark.parametrize("scheme", [QuantScheme("int4", 32, False), QuantScheme("int8", 32)], ids=QuantScheme.describe)
@pytest.mark.parametrize("rows", [17, 64])
def test_passes_split_over_threads_give_every_channel_the_same_bits(scheme, rows):
    """7 passes of 32 channels (the last one partial), each thread's next pass dequantized
    between its current pass's tile products: any thread count, every channel, the same bits."""
    layer, weight = bf16_layer(scheme, k_in=576, n_out=200)
    x = torch.randn(rows, 576).bfloat16()
    args = (layer.qweight, layer.scales, getattr(layer, "offsets", None), 32)
    threads = torch.get_num_threads()
    try:
        outs = []
        for count in (1, 2, 3, 8):
            torch.set_num_threads(count)
            outs.append(KERNELS.quant_gemm_bf16(x, *args))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(out, outs[0]) for out in outs[1:])
    torch.testing.assert_close(outs[0].double(), x.double() @ weight.double().t(), rtol=2 ** -8, atol=1e-3)


@pytest.mark.parametrize("scheme", SCHEMES, ids=QuantScheme.describe)
@pytest.mark.parametrize("k_in", [320, 352])
def test_native_bf16_dequantization_is_the_reference_rounded_to_bf16(scheme, k_in):
    """352 inputs: an odd number of 32-input groups (int4 g32 unpacks two groups a step, the last alone)."""
    layer, weight = bf16_layer(scheme, k_in=k_in, n_out=37)
    got = KERNELS.dequantize_bf16(layer.qweight, layer.scales, getattr(layer, "offsets", None),
                                  scheme.group_size or k_in)
    assert torch.equal(got, weight)


def test_the_layer_picks_the_kernel_tiles_or_onednn_by_rows():
    """Up to 16 rows the float-activation kernel (a row is a one-row step's bit for bit), then the
    tiles, and above AMX_BF16_MAX_ROWS oneDNN on the bf16 weight; shapes the tiles cannot split
    (K not a multiple of 32) keep the older paths."""
    layer, weight = bf16_layer(QuantScheme("int4", 32, False), k_in=320, n_out=37)
    args = (layer.qweight, layer.scales, layer.offsets, 32)
    few = torch.randn(KERNEL_MAX_ROWS, 320).bfloat16()
    float_kernel = KERNELS.quant_gemm(few.float(), *args).bfloat16() + layer.bias
    assert torch.equal(layer(few), float_kernel)
    batch = torch.randn(KERNEL_MAX_ROWS + 1, 320).bfloat16()
    assert torch.equal(layer(batch), KERNELS.quant_gemm_bf16(batch, *args) + layer.bias)
    chunk = torch.randn(AMX_BF16_MAX_ROWS + 1, 320).bfloat16()
    assert torch.equal(layer(chunk), F.linear(chunk, weight, layer.bias))
    odd, odd_weight = bf16_layer(QuantScheme("int4", 20, False), k_in=300, n_out=37)
    x = torch.randn(40, 300).bfloat16()
    torch.testing.assert_close(odd(x).double(), F.linear(x.double(), odd_weight.double(), odd.bias.double()),
                               rtol=0.02, atol=0.02)


def test_a_decode_step_picks_the_kernel_by_sequences_so_verified_rows_equal_plain_steps():
    """In a decode step more than AMX_BF16_MIN_DECODE_SEQUENCES sequences take the tiles at any
    row count (9-16 rows were dearer on the few-row kernel); fewer keep the float kernel up to 16
    rows, whatever their drafts add. So a sequence's verified row has the bits of its row in a plain
    step of the same sequences: both ride the same kernel, whose rows do not depend on each other."""
    layer, _ = bf16_layer(QuantScheme("int4", 32, False), k_in=320, n_out=37)
    args = (layer.qweight, layer.scales, layer.offsets, 32)
    many = AMX_BF16_MIN_DECODE_SEQUENCES + 1
    x = torch.randn(KERNEL_MAX_ROWS, 320).bfloat16()
    tiles = KERNELS.quant_gemm_bf16(x, *args) + layer.bias
    float_kernel = KERNELS.quant_gemm(x.float(), *args).bfloat16() + layer.bias
    assert not torch.equal(tiles, float_kernel)  # the two kernels round differently: the pick shows
    with decode_step(many):
        plain, verify = layer(x[:many]), layer(x)  # one row each, or one sequence's 8 rows beside them
    assert torch.equal(plain, tiles[:many]) and torch.equal(verify, tiles)
    with decode_step(AMX_BF16_MIN_DECODE_SEQUENCES):
        plain, verify = layer(x[:AMX_BF16_MIN_DECODE_SEQUENCES]), layer(x)
    assert torch.equal(plain, float_kernel[:AMX_BF16_MIN_DECODE_SEQUENCES]) and torch.equal(verify, float_kernel)
    with decode_step(None):  # a step with a prompt chunk: by rows, as outside a step
        assert torch.equal(layer(x[:many]), float_kernel[:many])


@pytest.mark.parametrize("scheme", [QuantScheme("int4", 64, False), QuantScheme("int4", 128, True),
                                    QuantScheme("int8")], ids=QuantScheme.describe)
def test_groups_the_few_row_kernel_unpacks_per_row_take_the_tiles_from_two_decoding_sequences(scheme):
    """With groups other than 32 inputs the few-row kernel unpacks the weights once per row (2-8
    rows cost 1.1-3.4x the tiles' CPU), so a decode step of 2 sequences and more takes the tiles;
    one sequence (and its drafts), prompt chunks and calls outside a step keep picking by rows."""
    layer, _ = bf16_layer(scheme, k_in=256, n_out=37)
    args = (layer.qweight, layer.scales, getattr(layer, "offsets", None), scheme.group_size or 256)
    x = torch.randn(6, 256).bfloat16()
    tiles = KERNELS.quant_gemm_bf16(x, *args) + layer.bias
    float_kernel = KERNELS.quant_gemm(x.float(), *args).bfloat16() + layer.bias
    assert not torch.equal(tiles, float_kernel)
    assert layer.quant_method.batch_takes_bf16_tiles(layer, torch.bfloat16)
    assert not layer.quant_method.batch_takes_bf16_tiles(layer, torch.float32)
    with decode_step(2):
        assert torch.equal(layer(x[:2]), tiles[:2]) and torch.equal(layer(x), tiles)  # plain, verified
    for sequences in (1, None):
        with decode_step(sequences):
            assert torch.equal(layer(x), float_kernel)
    g32, _ = bf16_layer(QuantScheme("int4", 32, False), k_in=256, n_out=37)
    assert not g32.quant_method.batch_takes_bf16_tiles(g32, torch.bfloat16)


def test_bad_inputs_are_clear_errors():
    layer, _ = bf16_layer(QuantScheme("int4", 32, False), k_in=64, n_out=16)
    with pytest.raises(ValueError, match="bfloat16 activations"):
        KERNELS.quant_gemm_bf16(torch.randn(20, 64), layer.qweight, layer.scales, layer.offsets, 32)



@pytest.mark.parametrize(("kind", "sequences", "fused"), [("q4_1", AMX_BF16_MIN_DECODE_SEQUENCES + 1, 8),
                                                          ("int4-g64", 2, 1)])
def test_in_a_bf16_batch_of_many_sequences_verified_rows_are_their_plain_steps_bit_for_bit(
        tiny_llama, kind, sequences, fused):
    """Nine sequences (q4_1), each verifying a 3-token draft (27 rows), against three plain steps of
    the same nine: the same kernel (the tiles) either way, so the logits are equal bit for bit.
    Before, the plain steps' 9 rows took the float kernel and the 27 the tiles. With 64-input
    groups two sequences already take the tiles per layer, and the fused step (`fused`: the most
    sequences it takes) keeps one sequence only."""
    from test_llm_spec_fused import KINDS

    from llm_engine import LLM
    from llm_engine.layers.attention import SeqSlice
    from llm_engine.model_runner import StepInput

    runner = LLM(model=str(tiny_llama), dtype="bfloat16", quantization=KINDS[kind], block_size=4,
                 kv_cache_memory="4MiB", enable_prefix_caching=False, num_threads=1).engine.model_runner
    assert runner.decode_stack is not None and runner.decode_stack.max_sequences == fused
    start, drafted = 13, 3
    tokens = torch.randint(3, 320, (sequences, start + drafted), generator=torch.Generator().manual_seed(7)).tolist()
    tables = [list(range(5 * i, 5 * i + 5)) for i in range(sequences)]

    def decode(rows: range, as_decodes: bool) -> torch.Tensor:
        ids = [tokens[s][p] for s in range(sequences) for p in rows]
        slices = [SeqSlice(rows[0], len(rows), tables[s], as_decodes=as_decodes) for s in range(sequences)]
        return runner.run_step(StepInput(ids, [p for _ in range(sequences) for p in rows], slices,
                                         list(range(len(ids))), [], []))[0].view(sequences, len(rows), -1)

    with torch.inference_mode():
        for s in range(sequences):  # each prompt, one causal chunk
            runner.run_step(StepInput(tokens[s][:start], list(range(start)), [SeqSlice(0, start, tables[s])],
                                      [start - 1], [], []))
        plain = torch.stack([decode(range(p, p + 1), False)[:, 0] for p in range(start, start + drafted)], 1)
        verified = decode(range(start, start + drafted), True)
    assert torch.equal(verified, plain)
