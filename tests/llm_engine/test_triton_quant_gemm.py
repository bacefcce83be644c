"""The Triton dequantizing GEMMs against the engine's own dequantization (layers/quantization.py:
float32 weight, rounded to the activations' dtype, F.linear), on CPU tensors in Triton's interpreter
(on the GPU where there is one): int4 groups of 32/64/128 symmetric and with zero points, a partial
last group, M not a multiple of the row block, int8 and fp8; AWQ and GPTQ checkpoints through the
loader's repacking; and a quantized Llama through the Triton path equal to the CPU path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import check_logprobs_close, int4_rounding_bound
from triton_interpret import CUDA, DEVICES, INTERPRETED, assert_close_to_reference

from llm_engine import LLM, SamplingParams
from llm_engine.kernels import fused, quant_gemm, switch
from llm_engine.layers.linear import ReplicatedLinear
from llm_engine.layers.quantization import (
    QuantScheme,
    WeightOnlyLinearMethod,
    dequantize,
    pack_int4,
    quantize_activations,
    quantize_fp8,
    quantize_int4,
    quantize_int8,
)
from llm_engine.layers.quantization_formats import CheckpointQuant, awq_pack, pack_int32, quantize_rtn
from llm_engine.loader.quantized_checkpoint import repack

M, K, N = 19, 100, 37  # K = 100: the last group of 32 or 64 is partial, and g128 is one partial group
cpu_only = pytest.mark.skipif(not INTERPRETED, reason="compares the Triton path with the CPU path on CPU tensors")


def reference(x: torch.Tensor, qweight, scales, offsets, group: int, bias=None) -> torch.Tensor:
    return F.linear(x, dequantize(qweight, scales, offsets, group).to(x.dtype), bias)


def inputs(dtype: torch.dtype, k_in: int = K, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    return torch.randn(N, k_in), torch.randn(M, k_in).to(dtype), torch.randn(N).to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group,symmetric,dtype", [
    (32, True, torch.float32), (32, False, torch.float32), (64, True, torch.float32), (64, False, torch.float32),
    (128, True, torch.float32), (128, False, torch.float32), (32, True, torch.bfloat16), (64, False, torch.bfloat16),
    (128, False, torch.float16),
])
def test_int4_gemm_matches_the_dequantized_matmul(device, group, symmetric, dtype):
    w, x, bias = inputs(dtype, seed=group)
    codes, scales, offsets = quantize_int4(w, group, symmetric)
    qweight = pack_int4(codes, group)
    out = quant_gemm.int4_gemm(x.to(device), qweight.to(device), scales.to(device), offsets.to(device), group,
                               bias.to(device))
    assert out.shape == (M, N) and out.dtype == dtype
    assert_close_to_reference(out, reference(x, qweight, scales, offsets, group, bias))


@pytest.mark.parametrize("device", DEVICES)
def test_split_k_partials_add_up_to_the_unsplit_result(device, monkeypatch):
    """SPLIT_K 3 over 4 groups (one split takes two), the bias added once."""
    monkeypatch.setattr(quant_gemm._TUNER, "candidates", [{"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "SPLIT_K": 3}])
    w, x, bias = inputs(torch.float32)
    codes, scales, offsets = quantize_int4(w, 32, False)
    qweight = pack_int4(codes, 32)
    out = quant_gemm.int4_gemm(x.to(device), qweight.to(device), scales.to(device), offsets.to(device), 32,
                               bias.to(device))
    assert_close_to_reference(out, reference(x, qweight, scales, offsets, 32, bias))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group,dtype", [(None, torch.float32), (32, torch.float32), (None, torch.bfloat16)])
def test_int8_gemm_per_channel_and_grouped(device, group, dtype):
    w, x, _ = inputs(dtype)
    group = group or K
    qweight, scales = quantize_int8(w, group)
    out = quant_gemm.int8_gemm(x.to(device).view(1, M, K), qweight.to(device), scales.to(device), group)
    assert out.shape == (1, M, N)  # leading dims kept
    assert_close_to_reference(out[0], reference(x, qweight, scales, None, group))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group,dtype", [(K, torch.float32), (32, torch.bfloat16)])
def test_fp8_gemm_upcasts_in_the_kernel(device, group, dtype):
    w, x, _ = inputs(dtype)
    qweight, scales = quantize_fp8(w, group, per_tensor=False)
    out = quant_gemm.fp8_gemm(x.to(device), qweight.to(device), scales.to(device), group, scaled_mm=False)
    assert_close_to_reference(out, reference(x, qweight, scales, None, group))


def test_fp8_scaled_mm_rounds_the_activations_to_fp8_per_tensor():
    """torch._scaled_mm runs on the CPU too: the wrapper's scales and layout, checked here."""
    torch.manual_seed(0)
    w, x, bias = torch.randn(48, 64), torch.randn(5, 64), torch.randn(48)
    qweight, scales = quantize_fp8(w, 64, per_tensor=False)
    x_scale = x.abs().amax() / quant_gemm.FP8_MAX
    x_fp8 = (x / x_scale).to(torch.float8_e4m3fn).float() * x_scale
    out = quant_gemm.fp8_gemm(x, qweight, scales, 64, bias, scaled_mm=True)
    assert_close_to_reference(out, reference(x_fp8, qweight, scales, None, 64, bias))
    with pytest.raises(ValueError, match="per output channel"):
        quant_gemm.fp8_gemm(x, *quantize_fp8(w, 32, per_tensor=False), 32, scaled_mm=True)


def test_bad_inputs_are_clear_errors():
    w, x, _ = inputs(torch.float32)
    qweight, scales = quantize_int8(w, 32)
    with pytest.raises(ValueError, match="does not take 64 inputs"):
        quant_gemm.int8_gemm(x[:, :64], qweight, scales, 32)
    with pytest.raises(ValueError, match="activations must be"):
        quant_gemm.int8_gemm(x.double(), qweight, scales, 32)
    with pytest.raises(ValueError, match="reads torch.uint8 weights, got torch.int8"):
        quant_gemm.int4_gemm(x, qweight, scales, scales, 32)


def loaded_layer(method: WeightOnlyLinearMethod, k_in: int, n_out: int, tensors: dict[str, torch.Tensor]
                 ) -> ReplicatedLinear:
    layer = ReplicatedLinear(k_in, n_out, quant_method=method)
    for name, tensor in tensors.items():
        param = getattr(layer, name)
        param.weight_loader(param, tensor)
    method.process_weights_after_loading(layer)
    return layer


def triton_and_cpu(layer: ReplicatedLinear, x: torch.Tensor, device: str, monkeypatch
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's output through the Triton path (on `device`) and through its CPU path (M > 16
    rows: the dequantized F.linear, the engine's own dequantization)."""
    cpu = layer(x)
    if device == "cpu":
        monkeypatch.setattr(switch, "on_cpu", True)
    return layer.to(device)(x.to(device)), cpu


def checkpoint(method: str, w: torch.Tensor, bits: int, group: int) -> tuple[CheckpointQuant, dict, torch.Tensor]:
    """AWQ or GPTQ (v1, act-order) tensors of w [N, K] as those tools write them, and the exact
    dequantized weight (q - z) * s they stand for."""
    k_in = w.shape[1]
    perm = torch.randperm(k_in) if method == "gptq" else torch.arange(k_in)  # act-order: groups over shuffled inputs
    codes, zeros, scales = quantize_rtn(w[:, perm], bits, group, symmetric=bits == 8, min_zero=1)
    g_idx = torch.empty(k_in, dtype=torch.int32)
    g_idx[perm] = (torch.arange(k_in) // group).to(torch.int32)
    unpermuted = torch.empty_like(codes)
    unpermuted[perm] = codes
    exact = ((unpermuted - zeros[g_idx.long()]) * scales.float()[g_idx.long()]).t()
    if method == "awq":
        tensors = {"qweight": awq_pack(unpermuted), "qzeros": awq_pack(zeros), "scales": scales}
    else:
        tensors = {"qweight": pack_int32(unpermuted, bits, dim=0), "qzeros": pack_int32(zeros - 1, bits, dim=1),
                   "scales": scales, "g_idx": g_idx}
    quant = CheckpointQuant(method, bits, group, act_order=method == "gptq", zero_offset=int(method == "gptq"),
                            modules=frozenset({"proj"}))
    return quant, {f"proj.{name}": tensor for name, tensor in tensors.items()}, exact


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method,bits,group", [("awq", 4, 32), ("gptq", 4, 64), ("gptq", 8, 128)])
def test_awq_and_gptq_checkpoints_repacked_at_load_run_in_the_kernel(device, method, bits, group, monkeypatch):
    torch.manual_seed(bits + group)
    k_in, n_out = 128, 40
    w, x = torch.randn(n_out, k_in), torch.randn(M, k_in)
    quant, tensors, exact = checkpoint(method, w, bits, group)
    engine = {name.removeprefix("proj."): tensor for name, tensor in repack(iter(tensors.items()), quant)}
    layer = loaded_layer(WeightOnlyLinearMethod(quant.scheme, prequantized=True, act_order=quant.act_order),
                         k_in, n_out, engine)
    ours, cpu = triton_and_cpu(layer, x, device, monkeypatch)
    if bits == 4 and group == 32:  # M rows of 32-input groups stay on the CPU kernel, which may round x to int16
        scale = float(cpu.abs().max())
        torch.testing.assert_close(ours.cpu(), cpu, rtol=2e-5, atol=2e-5 * scale + int4_rounding_bound(x, exact))
    else:
        assert_close_to_reference(ours, cpu)
    ours = ours.cpu()
    # the layout's float16 offset -z * s moves results a little from an exact (q - z) * s
    torch.testing.assert_close(ours, F.linear(x, exact), rtol=1e-2, atol=1e-2 * float(ours.abs().max()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scheme", [QuantScheme("w8a8"), QuantScheme("w4a8", 32), QuantScheme("fp8", 32)])
def test_activation_rounding_and_fp8_layers_take_the_triton_path(device, scheme, monkeypatch):
    torch.manual_seed(1)
    method = WeightOnlyLinearMethod(scheme)
    layer = loaded_layer(method, 64, 24, {"weight": torch.randn(24, 64)})
    x = torch.randn(M, 64)
    offsets = layer.offsets.data if scheme.weights == "int4" else None
    weights = (layer.qweight.data, layer.scales.data, offsets, method.group(layer))  # CPU copies
    ours, cpu = triton_and_cpu(layer, x, device, monkeypatch)
    assert_close_to_reference(ours, cpu)
    if scheme.act_block(64):  # the same activation rounding as the CPU path's, not float activations
        ours = ours.cpu()
        assert not torch.allclose(ours, reference(x, *weights), atol=1e-4)
        assert_close_to_reference(ours, reference(quantize_activations(x, scheme.act_block(64)), *weights))


MIXED = {"config_groups": {
    "attention": {"targets": ["re:.*self_attn.*"], "method": "int4", "group_size": 32},
    "gate_up": {"targets": ["gate_proj", "up_proj"], "method": "int4", "group_size": 64, "symmetric": False},
    "down": {"targets": ["down_proj"], "method": "int8"},
}}
PROMPTS = [[5, 17, 33, 2, 9, 11], [100, 4, 250]]  # two sequences: the one-sequence native decode stack stays off


def greedy(llm: LLM) -> list[tuple[list[int], list[dict]]]:
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, logprobs=0)  # a prefill, a decode
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in llm.generate(PROMPTS, params, use_tqdm=False)]


def count_calls(monkeypatch, module, names: list[str], calls: dict[str, int]) -> None:
    """Counts each call of module.<name> in calls[name]."""
    for name in names:
        calls[name] = 0

        def counted(*args, _real=getattr(module, name), _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)


@cpu_only
def test_quantized_llama_through_the_triton_path_matches_the_cpu_path(tiny_llama, monkeypatch):
    """int4 (sym g32, asym g64) and int8 layers, norms, rotary and SiLU * up all on the Triton kernels."""
    llm = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=8, quantization=MIXED)
    cpu = greedy(llm)
    calls: dict[str, int] = {}
    count_calls(monkeypatch, fused, ["rms_norm", "fused_add_rms_norm", "rotary_embedding", "silu_and_mul"], calls)
    count_calls(monkeypatch, quant_gemm, ["quant_gemm"], calls)
    monkeypatch.setattr(switch, "on_cpu", True)
    ours = greedy(llm)
    assert all(calls.values()), calls
    check_logprobs_close(ours, [(tokens, [top[t].logprob for t, top in zip(tokens, logprobs)])
                                for tokens, logprobs in cpu], atol=1e-4)


@pytest.mark.skipif(not CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_quantized_llama_on_cuda_matches_the_cpu_engine(tiny_llama, dtype):
    cpu = greedy(LLM(str(tiny_llama), dtype="float32", num_kv_blocks=8, quantization=MIXED))
    ours = greedy(LLM(str(tiny_llama), dtype=dtype, num_kv_blocks=8, quantization=MIXED, device="cuda"))
    if dtype == "float32":
        check_logprobs_close(ours, [(tokens, [top[t].logprob for t, top in zip(tokens, logprobs)])
                                    for tokens, logprobs in cpu], atol=1e-3)
    else:  # bf16 rounding may flip a near tie later on; the first token's logprob stays close
        assert abs(ours[0][1][0][ours[0][0][0]].logprob - cpu[0][1][0][cpu[0][0][0]].logprob) < 0.1
