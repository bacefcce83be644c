"""FP8 E4M3 weights and int8 activations (w8a8, w4a8): rounding, kernels, fallbacks, configs."""

from __future__ import annotations

import pytest
import torch

from llm_engine import LLM, SamplingParams
from llm_engine.config import EngineConfig
from llm_engine.layers import native
from llm_engine.layers.linear import ReplicatedLinear
from llm_engine.layers.quantization import (
    QuantScheme,
    WeightOnlyLinearMethod,
    dequantize,
    quantize_activations,
    quantize_fp8,
)

FP8_SCHEMES = [QuantScheme("fp8"), QuantScheme("fp8", 32), QuantScheme("fp8", per_tensor=True)]
# (scheme, K): K multiples of 32; 576 with g128 ends in a 64-input group, 320 with g64 in a 0-length one
# (g32 with one row takes the decode fast path)
ACT_CASES = [(QuantScheme("w8a8"), 320), (QuantScheme("w8a8", 32), 320), (QuantScheme("w8a8", 64), 320),
             (QuantScheme("w4a8", 32, False), 320), (QuantScheme("w4a8", 64, True), 320),
             (QuantScheme("w4a8", 128, False), 576)]


@pytest.mark.parametrize("scheme", FP8_SCHEMES, ids=QuantScheme.describe)
def test_fp8_rounding_is_torchs_e4m3_of_the_scaled_weight(scheme):
    w = torch.randn(17, 100) * 0.05
    group = scheme.group_size or 100
    q, scales = quantize_fp8(w, group, scheme.per_tensor)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape and scales.dtype == torch.float16
    per_input = scales.float().repeat_interleave(group, 1)[:, :100]
    assert torch.equal(dequantize(q, scales, None, group), (w / per_input).to(torch.float8_e4m3fn).float() * per_input)
    if scheme.per_tensor:
        assert bool((scales == scales[0, 0]).all())
    # 3 mantissa bits: within 1/16 of each weight, or of the smallest normal step
    assert bool(((dequantize(q, scales, None, group) - w).abs() <= w.abs() / 16 + per_input * 2 ** -9).all())


def quantized_layer(scheme: QuantScheme, k_in: int, n_out: int) -> tuple[ReplicatedLinear, torch.Tensor]:
    torch.manual_seed(0)
    layer = ReplicatedLinear(k_in, n_out, bias=True, quant_method=WeightOnlyLinearMethod(scheme))
    layer.weight.data.copy_(torch.randn(n_out, k_in) * 0.05)
    layer.bias.data.copy_(torch.randn(n_out))
    layer.quant_method.process_weights_after_loading(layer)
    weight = dequantize(layer.qweight, layer.scales, getattr(layer, "offsets", None), scheme.group_size or k_in)
    return layer, weight


@pytest.mark.parametrize("scheme", FP8_SCHEMES, ids=QuantScheme.describe)
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_fp8_kernel_matches_the_dequantized_float_matmul(scheme, rows):
    layer, weight = quantized_layer(scheme, k_in=300, n_out=37)
    assert layer.kernels is not None and layer.qweight.dtype == torch.float8_e4m3fn
    x = torch.randn(rows, 300)
    expected = torch.nn.functional.linear(x.double(), weight.double(), layer.bias.double()).float()
    torch.testing.assert_close(layer(x), expected, atol=2e-4, rtol=1e-4)
    direct = layer.kernels.quant_gemm(x, layer.qweight, layer.scales, None, scheme.group_size or 300)
    torch.testing.assert_close(direct + layer.bias, expected, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("scheme,k_in", ACT_CASES, ids=lambda v: v.describe() if isinstance(v, QuantScheme) else str(v))
@pytest.mark.parametrize("rows", [1, 5, 64, 300])
def test_integer_kernels_match_int8_activations_times_the_dequantized_weight(scheme, k_in, rows):
    """Decode sizes run the integer kernel, larger batches the PyTorch path, or AMX tiles for all
    but one row where the CPU has them (300 rows: two passes over the weights): all equal the
    reference (activations rounded per token or per 32 inputs, then a float matmul), near float."""
    layer, weight = quantized_layer(scheme, k_in, n_out=45)
    x = torch.randn(rows, k_in)
    x[0, 3] = 9.0  # an outlier: its block's scale is coarse
    block = scheme.act_block(k_in)
    expected = (quantize_activations(x, block).double() @ weight.double().t() + layer.bias.double()).float()
    torch.testing.assert_close(layer(x), expected, atol=3e-4, rtol=1e-4)
    float_out = x @ weight.t() + layer.bias
    assert (layer(x) - float_out).abs().max() < 0.05 * float_out.abs().max()


@pytest.mark.parametrize("symmetric", [False, True], ids=["offsets", "symmetric"])
def test_w4a8_eight_channels_a_pass_match_the_reference_and_keep_each_rows_result(symmetric):
    """int4 g32 layers with channels in eights take csrc/quant_gemm_q8_columns.cpp at every row
    count (300 rows: tiles of 64 and a partial one): the reference's result, and each row's the
    same whatever rows are beside it (a verified row is its one-token step)."""
    kernels = native.cpu_kernels()
    if kernels is None or not kernels.int4_q8_columns_fit(48, 320, 32):
        pytest.skip("no AVX2 kernels in this build")
    assert not kernels.int4_q8_columns_fit(45, 320, 32) and not kernels.int4_q8_columns_fit(48, 320, 64)
    layer, weight = quantized_layer(QuantScheme("w4a8", 32, symmetric), 320, n_out=48)
    x = torch.randn(300, 320) * torch.linspace(0.01, 10, 300).unsqueeze(1)  # scales far apart
    x[0, 3] = 90.0  # an outlier: its block's scale is coarse
    x[1, 32:64] = 0  # an all-zero block: scale 0
    expected = (quantize_activations(x, 32).double() @ weight.double().t() + layer.bias.double()).float()
    for rows in (1, 2, 7, 64, 65, 300):
        torch.testing.assert_close(layer(x[:rows]), expected[:rows], atol=1e-5 * float(expected.abs().max()), rtol=0)
    offsets = layer.offsets
    kernels.amx = None  # this instance's: AMX tiles, where there are any, take 2+ rows in other sums
    alone = [kernels.quant_gemm_q8(x[i:i + 1], layer.qweight, layer.scales, offsets, 32, 32) for i in (0, 1, 64, 299)]
    together = kernels.quant_gemm_q8(x, layer.qweight, layer.scales, offsets, 32, 32)
    assert all(torch.equal(row, together[i:i + 1]) for row, i in zip(alone, (0, 1, 64, 299)))


@pytest.mark.skipif(native.cpu_kernels() is None or native.cpu_kernels().amx is None,  # type: ignore[union-attr]
                    reason="no AMX tiles on this CPU or in this build")
@pytest.mark.parametrize("scheme,k_in", ACT_CASES, ids=lambda v: v.describe() if isinstance(v, QuantScheme) else str(v))
def test_amx_tiles_give_the_vnni_kernels_results_up_to_float_summation_order(scheme, k_in):
    kernels = native.cpu_kernels()
    assert kernels is not None and kernels.amx is not None
    layer, _ = quantized_layer(scheme, k_in, n_out=45)  # 45: a partial block of 16 channels
    x = torch.randn(37, k_in)  # a partial block of 16 rows
    group, block = scheme.group_size or k_in, scheme.act_block(k_in)
    offsets = getattr(layer, "offsets", None)
    tiles = kernels.quant_gemm_q8(x, layer.qweight, layer.scales, offsets, group, block)
    amx, kernels.amx = kernels.amx, None
    try:
        vnni = kernels.quant_gemm_q8(x, layer.qweight, layer.scales, offsets, group, block)
    finally:
        kernels.amx = amx
    torch.testing.assert_close(tiles, vnni, atol=1e-5 * float(vnni.abs().max()), rtol=0)


def test_activation_rounding_reference_matches_the_kernels_own():
    kernels = native.cpu_kernels()
    x = torch.randn(3, 96) * torch.tensor([1.0, 10.0, 0.01]).unsqueeze(1)
    x[2] = 0  # an all-zero block has scale 0
    for block in (32, 96):
        xq, dx, sx = kernels.quantize_rows(x, block)
        rebuilt = xq.float() * dx.repeat_interleave(32, 1)
        torch.testing.assert_close(rebuilt, quantize_activations(x, block), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(sx, (rebuilt.view(3, -1, 32)).sum(-1), atol=1e-5, rtol=1e-5)


def test_a_rows_share_scaled_by_the_whole_rows_absmax_is_the_whole_rows_rounding_cut():
    """What a row-parallel w8a8 rank does with the all-reduced absmax: its half of each row rounds
    (kernel form and reference) exactly as that half of the whole row does; its own scale would not."""
    kernels = native.cpu_kernels()
    x = torch.randn(4, 192) * torch.tensor([1.0, 10.0, 0.01, 0.0]).unsqueeze(1)
    x[:, 0] = 3 * x.abs().amax(-1)  # each row's absmax in the first half: the second's own scale is smaller
    whole_q, whole_dx, whole_sx = kernels.quantize_rows(x, 192)
    absmax = x.abs().amax(-1)
    for half in (0, 1):
        share = x[:, half * 96:(half + 1) * 96]
        xq, dx, sx = kernels.quantize_rows(share, 96, absmax)
        assert torch.equal(xq, whole_q[:, half * 96:(half + 1) * 96])
        assert torch.equal(dx, whole_dx[:, half * 3:(half + 1) * 3]) and torch.equal(sx, whole_sx[:, half * 3:(half + 1) * 3])
        assert torch.equal(quantize_activations(share, 96, absmax), quantize_activations(x, 192)[:, half * 96:(half + 1) * 96])
    assert not torch.equal(kernels.quantize_rows(share, 96)[0][:3], xq[:3])
    with pytest.raises(ValueError, match="one block a row"):
        kernels.quantize_rows(x, 32, absmax)
    with pytest.raises(ValueError, match="one block a row"):
        quantize_activations(x, 32, absmax)


def test_without_a_compiler_fp8_and_w8a8_run_in_pytorch(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", "/bin/false")
    monkeypatch.setenv("CODEYARD_KERNEL_CACHE", str(tmp_path))
    native.load_kernels.cache_clear()
    try:
        for scheme in (QuantScheme("fp8"), QuantScheme("w8a8"), QuantScheme("w4a8", 32, False)):
            layer, weight = quantized_layer(scheme, 96, 21)
            assert layer.kernels is None
            x = torch.randn(1, 96)
            block = scheme.act_block(96)
            ref_x = x if block is None else quantize_activations(x, block)
            torch.testing.assert_close(layer(x), ref_x @ weight.t() + layer.bias, atol=1e-4, rtol=1e-4)
    finally:
        native.load_kernels.cache_clear()


def test_integer_kernels_refuse_shapes_they_cannot_split():
    with pytest.raises(ValueError, match="multiple of 32"):
        ReplicatedLinear(100, 8, quant_method=WeightOnlyLinearMethod(QuantScheme("w8a8")))
    with pytest.raises(ValueError, match="groups of 32 or a multiple of 64"):
        ReplicatedLinear(192, 8, quant_method=WeightOnlyLinearMethod(QuantScheme("w4a8", 96, False)))


@pytest.mark.parametrize("value,message", [
    ({"method": "fp8", "strategy": "tensor", "group_size": 32}, "per-tensor scale takes no group_size"),
    ({"method": "int8", "strategy": "tensor"}, "strategy must be"),
    ({"method": "fp8", "strategy": "row"}, "strategy must be"),
    ({"method": "w8a8", "symmetric": False}, "symmetric only"),
    ({"method": "w4a8", "group_size": None}, "give a group_size"),
])
def test_malformed_fp8_and_w8a8_configs_are_clear_errors(tiny_llama, value, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(model=str(tiny_llama), quantization=value)


def test_fp8_attention_and_w8a8_mlp_in_one_model(tiny_llama):
    config = {"config_groups": {"attn": {"targets": ["re:.*self_attn.*"], "method": "fp8", "strategy": "tensor"},
                                "mlp": {"targets": ["re:.*mlp.*"], "method": "w8a8"}}}
    llm = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=8, quantization=config)
    effective = llm.engine.model_runner.quantization
    assert effective["model.layers.0.self_attn.qkv_proj"] == "fp8 per-tensor"
    assert effective["model.layers.1.mlp.down_proj"] == "w8a8 per-channel"
    reference = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=8)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    ours = llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)[0].outputs[0]
    ref = reference.generate([[5, 6, 7, 8]], params, use_tqdm=False)[0].outputs[0]
    # first token from the same prompt: its logprob moves by the rounding, not more
    first_ours, first_ref = ours.logprobs[0][ours.token_ids[0]].logprob, ref.logprobs[0][ref.token_ids[0]].logprob
    assert abs(first_ours - first_ref) < 0.1
