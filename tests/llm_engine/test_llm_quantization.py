"""Weight-only int8/int4 quantization: packing, the native kernel, per-layer configs, errors."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import COMMON, check_logprobs_close, hf_greedy, int4_kernel_activations
from transformers import AutoModelForCausalLM, LlamaConfig

from llm_engine import LLM, SamplingParams
from llm_engine.config import EngineConfig
from llm_engine.layers import native
from llm_engine.layers.linear import ReplicatedLinear
from llm_engine.layers.quant_config import QuantConfig, assign_quantization, checkpoint_names
from llm_engine.layers.quantization import (
    KERNEL_MAX_ROWS,
    QuantScheme,
    WeightOnlyLinearMethod,
    dequantize,
    pack_int4,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)

SCHEMES = [QuantScheme("int8"), QuantScheme("int8", 32), QuantScheme("int4", 32, True),
           QuantScheme("int4", 32, False), QuantScheme("int4", 64, False), QuantScheme("int4", 128, True)]


@pytest.mark.parametrize("k_in,group", [(96, 32), (100, 32), (576, 128), (10, 4)])
def test_int4_pack_unpack_round_trip(k_in, group):
    codes = torch.randint(0, 16, (7, k_in), dtype=torch.uint8)
    packed = pack_int4(codes, group)
    assert packed.shape == (7, k_in // 2) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed, group), codes)


@pytest.mark.parametrize("scheme", SCHEMES, ids=QuantScheme.describe)
def test_round_to_nearest_error_is_at_most_half_a_step(scheme):
    w = torch.randn(33, 200) * 0.1
    group = scheme.group_size or w.shape[1]
    if scheme.method == "int8":
        q, scales = quantize_int8(w, group)
        deq, step = dequantize(q, scales, None, group), scales
    else:
        codes, scales, offsets = quantize_int4(w, group, scheme.symmetric)
        assert int(codes.max()) <= 15
        deq, step = dequantize(pack_int4(codes, group), scales, offsets, group), scales
    assert deq.shape == w.shape
    bound = step.float().repeat_interleave(group, 1)[:, :w.shape[1]] * 0.51 + 1e-6  # f16 offsets round
    if scheme.method == "int4" and scheme.symmetric:
        bound = bound * 2  # [-8, 7]: the most negative value may clamp by up to one step
    assert bool(((deq - w).abs() <= bound).all())


def quantized_layer(scheme: QuantScheme, k_in: int, n_out: int, bias: bool) -> tuple[ReplicatedLinear, torch.Tensor]:
    torch.manual_seed(0)
    layer = ReplicatedLinear(k_in, n_out, bias=bias, quant_method=WeightOnlyLinearMethod(scheme))
    layer.weight.data.copy_(torch.randn(n_out, k_in) * 0.05)
    if bias:
        layer.bias.data.copy_(torch.randn(n_out))
    layer.quant_method.process_weights_after_loading(layer)
    group = scheme.group_size or k_in
    weight = dequantize(layer.qweight, layer.scales, getattr(layer, "offsets", None), group)
    return layer, weight


@pytest.mark.parametrize("scheme", SCHEMES, ids=QuantScheme.describe)
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_kernel_matches_dequantized_float_matmul(scheme, rows):
    """Odd output counts, K not a multiple of the group (a short last group), decode and batch."""
    layer, weight = quantized_layer(scheme, k_in=300, n_out=37, bias=True)
    assert layer.kernels is not None and not hasattr(layer, "weight")
    x = torch.randn(rows, 300)
    expected = torch.nn.functional.linear(x.double(), weight.double(), layer.bias.double()).float()
    torch.testing.assert_close(layer(x), expected, atol=2e-4, rtol=1e-4)
    # the kernel itself at every size, not only where apply picks it
    direct = layer.kernels.quant_gemm(x, layer.qweight, layer.scales, getattr(layer, "offsets", None),
                                      scheme.group_size or 300)
    torch.testing.assert_close(direct + layer.bias, expected, atol=2e-4, rtol=1e-4)
    assert rows <= KERNEL_MAX_ROWS or rows == 64


@pytest.mark.parametrize("scheme", [QuantScheme("int8", 32), QuantScheme("int4", 32, True), QuantScheme("int4", 32, False)],
                         ids=QuantScheme.describe)
def test_one_row_decode_path_of_32_input_groups_matches_the_dequantized_matmul(scheme):
    """K a multiple of 32 with one row takes the kernel's buffer-free decode path (GGUF's shape)."""
    layer, weight = quantized_layer(scheme, k_in=320, n_out=37, bias=False)
    x = torch.randn(1, 320)
    seen = int4_kernel_activations(x) if scheme.method == "int4" else x
    torch.testing.assert_close(layer(x), (seen.double() @ weight.double().t()).float(), atol=2e-4, rtol=1e-4)


def test_bfloat16_activations_run_the_kernel_and_return_bfloat16():
    layer, weight = quantized_layer(QuantScheme("int4", 32, False), 64, 48, bias=False)
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    out = layer(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), x.float() @ weight.t(), atol=0.05, rtol=0.02)


def test_without_a_compiler_quantized_layers_dequantize_in_pytorch(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", "/bin/false")
    monkeypatch.setenv("CODEYARD_KERNEL_CACHE", str(tmp_path))
    native.load_kernels.cache_clear()
    try:
        layer, weight = quantized_layer(QuantScheme("int4", 32, False), 100, 21, bias=False)
        assert layer.kernels is None
        x = torch.randn(1, 100)
        torch.testing.assert_close(layer(x), x @ weight.t(), atol=1e-4, rtol=1e-4)
    finally:
        native.load_kernels.cache_clear()


def hf_with_dequantized_weights(folder, plan: dict[str, QuantScheme | None]):
    """The Transformers model with each linear weight (and embedding table) replaced by its
    quantize-dequantize image."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    for name, module in model.named_modules():
        scheme = plan.get(name)
        if scheme is None or not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            continue
        w = module.weight.data
        group = scheme.group_size or w.shape[1]
        if scheme.method == "int8":
            deq = dequantize(*quantize_int8(w, group), None, group)
        else:
            codes, scales, offsets = quantize_int4(w, group, scheme.symmetric)
            deq = dequantize(pack_int4(codes, group), scales, offsets, group)
        module.weight.data.copy_(deq)
    return model


PER_LAYER = {
    "config_groups": {
        "attention": {"targets": ["re:.*self_attn.*"], "method": "int8"},
        "mlp": {"targets": ["gate_proj", "up_proj", "down_proj"], "method": "int4", "group_size": 32,
                "symmetric": False},
    },
    "ignore": ["model.layers.0.mlp"],
}


def test_per_layer_mixed_methods_match_transformers_on_the_same_rounded_weights(tiny_llama, caplog):
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]
    with caplog.at_level(logging.INFO, logger="llm_engine.model_runner"):
        llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory="16MiB", quantization=PER_LAYER)
    effective = llm.engine.model_runner.quantization
    assert effective["model.layers.0.self_attn.qkv_proj"] == "int8 per-channel"
    assert effective["model.layers.1.mlp.gate_up_proj"] == "int4 g32 asym"
    assert effective["model.layers.0.mlp.down_proj"] == "float"
    assert "int8 per-channel x 4" in caplog.text and "int4 g32 asym x 2" in caplog.text
    plan = {}
    for layer in range(2):
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            plan[f"model.layers.{layer}.self_attn.{proj}"] = QuantScheme("int8")
        for proj in ("gate_proj", "up_proj", "down_proj"):
            plan[f"model.layers.{layer}.mlp.{proj}"] = None if layer == 0 else QuantScheme("int4", 32, False)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    ours = [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in llm.generate(prompts, params, use_tqdm=False)]
    check_logprobs_close(ours, hf_greedy(hf_with_dequantized_weights(tiny_llama, plan), prompts, 12), atol=1e-3)


TABLES_INT4 = QuantScheme("int4", 32, False)
WITH_TABLES = {"config_groups": {
    "tables": {"targets": ["Embedding", "lm_head"], "method": "int4", "group_size": 32, "symmetric": False},
    "linear": {"targets": ["Linear"], "method": "int8"},
}}


def test_embedding_and_lm_head_are_quantized_when_targeted_and_match_transformers(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory="16MiB", quantization=WITH_TABLES)
    runner = llm.engine.model_runner
    assert runner.quantization["model.embed_tokens"] == runner.quantization["lm_head"] == "int4 g32 asym"
    assert runner.quantization["model.layers.1.mlp.down_proj"] == "int8 per-channel"
    assert not any(name.endswith(".weight") and ("embed_tokens" in name or "lm_head" in name)
                   for name, _ in runner.model.named_parameters())  # no float table kept
    plan: dict[str, QuantScheme | None] = {"model.embed_tokens": TABLES_INT4, "lm_head": TABLES_INT4}
    for layer in range(2):
        for proj in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            plan[f"model.layers.{layer}.{proj}"] = QuantScheme("int8")
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    ours = [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in llm.generate(prompts, params, use_tqdm=False)]
    check_logprobs_close(ours, hf_greedy(hf_with_dequantized_weights(tiny_llama, plan), prompts, 12), atol=1e-3)


def test_a_prompt_chunked_over_steps_that_sample_nothing_with_a_quantized_lm_head(tiny_llama):
    """A prompt longer than the step budget alone: its first chunks' steps sample nothing, so the
    LM head gets no rows (the quantized kernels could not take 0 rows and failed the request)."""
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    prompt = list(range(5, 45))  # 40 tokens, 16 a step: two steps with no row to sample
    answers = [LLM(str(tiny_llama), dtype="float32", kv_cache_memory="16MiB", quantization=WITH_TABLES,
                   **budget).generate([prompt], params, use_tqdm=False)[0].outputs[0]
               for budget in ({"max_num_batched_tokens": 16}, {})]
    assert [a.finish_reason for a in answers] == ["length", "length"]
    assert answers[0].token_ids == answers[1].token_ids


@pytest.mark.parametrize("scheme", [QuantScheme("int8"), TABLES_INT4, QuantScheme("int4", 128, True),
                                    QuantScheme("fp8")], ids=QuantScheme.describe)
def test_a_quantized_embedding_gathers_exactly_the_dequantized_rows(scheme):
    from llm_engine.layers.embedding import VocabParallelEmbedding

    torch.manual_seed(0)
    table = torch.randn(50, 200) * 0.1
    embedding = VocabParallelEmbedding(50, 200)
    embedding.set_quant_method(WeightOnlyLinearMethod(scheme))
    embedding.weight_loader(embedding.weight, table)
    embedding.process_weights_after_loading()
    group = scheme.group_size or 200
    whole = dequantize(embedding.qweight, embedding.scales, getattr(embedding, "offsets", None), group)
    ids = torch.tensor([[3, 49, 0], [3, 17, 48]])
    assert torch.equal(embedding(ids), whole[ids])
    assert float((whole - table).abs().max()) < 0.1 * float(table.abs().max())


def test_a_tied_lm_head_shares_the_quantized_embedding_table(tmp_path):
    config = LlamaConfig(**{**COMMON, "tie_word_embeddings": True})
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(5)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", kv_cache_memory="16MiB",
              quantization={"targets": ["Embedding"], "method": "int8", "group_size": 32})
    runner = llm.engine.model_runner
    assert runner.quantization["model.embed_tokens"] == "int8 g32"
    assert runner.quantization["lm_head"] == "tied to model.embed_tokens"
    assert runner.quantization["model.layers.0.mlp.down_proj"] == "float"
    head, embedding = runner.model.lm_head, runner.model.model.embed_tokens
    assert head.qweight is embedding.qweight and head.scales is embedding.scales
    hidden = torch.randn(3, COMMON["hidden_size"])
    deq = dequantize(embedding.qweight, embedding.scales, None, 32)
    torch.testing.assert_close(head.compute_logits(hidden), hidden @ deq.T, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="tied to model.embed_tokens"):
        LLM(str(tmp_path), dtype="float32", kv_cache_memory="16MiB",
            quantization={"targets": ["lm_head"], "method": "int8"})


def test_plain_method_names_leave_the_embedding_and_lm_head_float():
    assert QuantConfig.parse("int4").scheme_for(["model.embed_tokens"], "Embedding") is None
    assert QuantConfig.parse("int4").scheme_for(["lm_head"], None) is None
    config = QuantConfig.parse({"targets": ["Linear", "Embedding"], "method": "int8", "ignore": ["lm_head"]})
    assert config.scheme_for(["model.embed_tokens"], "Embedding") == QuantScheme("int8")
    assert config.scheme_for(["lm_head"], None) is None


def linear_bytes(llm: LLM) -> int:
    from llm_engine.layers.linear import LinearBase

    return sum(p.numel() * p.element_size() for m in llm.engine.model_runner.model.modules()
               if isinstance(m, LinearBase) for p in m.parameters())


@pytest.mark.parametrize("quantization,goal", [("int8", 0.55), ({"method": "int4", "group_size": 64}, 0.35)])
def test_quantized_linear_weights_meet_the_memory_goals_against_bf16(tiny_llama, quantization, goal):
    float32 = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=4)
    bf16_bytes = linear_bytes(float32) // 2  # a bf16 engine holds oneDNN's packed copies, not parameters
    llm = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=4, quantization=quantization)
    assert linear_bytes(llm) <= goal * bf16_bytes
    assert llm.engine.model_runner.weight_bytes < float32.engine.model_runner.weight_bytes
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


def test_auto_dtype_is_bfloat16_on_a_cpu_with_fast_bf16_quantized_or_not(tiny_llama, monkeypatch):
    """Quantized models too: their prefill-sized matmuls run ~3x faster in bf16 on such a CPU,
    which outweighs float32's faster decode steps for an inline completion."""
    monkeypatch.setattr("llm_engine.model_runner.cpu_has_fast_bf16", lambda: True)
    assert LLM(str(tiny_llama), num_kv_blocks=4).engine.model_runner.dtype == torch.bfloat16
    assert LLM(str(tiny_llama), num_kv_blocks=4, quantization="int4").engine.model_runner.dtype == torch.bfloat16
    f32 = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=4, quantization="int4")
    assert f32.engine.model_runner.dtype == torch.float32  # an explicit dtype is kept
    monkeypatch.setattr("llm_engine.model_runner.cpu_has_fast_bf16", lambda: False)
    assert LLM(str(tiny_llama), num_kv_blocks=4, quantization="int4").engine.model_runner.dtype == torch.float32


def test_targets_match_engine_and_checkpoint_names():
    config = QuantConfig.parse({"config_groups": {"q": {"targets": ["q_proj"], "method": "int8"},
                                                  "all": {"targets": ["Linear"], "method": "int4",
                                                          "group_size": 64}},
                                "ignore": ["re:.*layers\\.3\\..*"]})

    class Fused(torch.nn.Module):
        packed_modules = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k")}

    names = checkpoint_names(Fused(), "model.layers.2.self_attn.qkv_proj")
    assert names == ["model.layers.2.self_attn.qkv_proj", "model.layers.2.self_attn.q_proj",
                     "model.layers.2.self_attn.k_proj"]
    assert config.scheme_for(names) == QuantScheme("int8")
    assert config.scheme_for(["model.layers.2.mlp.down_proj"]) == QuantScheme("int4", 64, False)
    assert config.scheme_for(["model.layers.3.mlp.down_proj"]) is None


def test_yaml_config_file(tiny_llama, tmp_path):
    path = tmp_path / "per-layer.yaml"
    path.write_text("config_groups:\n  mlp:\n    targets: [down_proj]\n    method: int4\n    group_size: 32\n")
    llm = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=4, quantization=str(path))
    effective = llm.engine.model_runner.quantization
    assert effective["model.layers.1.mlp.down_proj"] == "int4 g32 asym"
    assert effective["model.layers.1.mlp.gate_up_proj"] == "float"


@pytest.mark.parametrize("value,message", [
    ("int3", "neither a method"),
    ({"method": "int4", "group_size": 33}, "group_size"),
    ({"method": "int4", "group_size": None}, "give a group_size"),
    ({"method": "int8", "symmetric": False}, "symmetric only"),
    ({"method": "int8", "bits": 8}, "unknown keys"),
    ({"config_groups": {"a": {"method": "int8"}}}, "needs targets"),
    ({"config_groups": {"a": {"targets": ["re:("], "method": "int8"}}}, "bad pattern"),
    ({"config_groups": {"a": {"targets": ["Linear"], "method": "gptq"}}}, "read from a checkpoint"),
])
def test_malformed_quantization_configs_are_clear_errors(tiny_llama, value, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(model=str(tiny_llama), quantization=value)


def test_gguf_mode_needs_a_gguf_file_and_unkept_block_types_fall_back_to_float(tiny_llama, caplog):
    from llm_engine.layers.attention import TorchPagedAttention
    from llm_engine.loader import ModelSource
    from llm_engine.models.llama import LlamaForCausalLM

    hf_config = ModelSource(str(tiny_llama)).hf_config()
    model = LlamaForCausalLM(hf_config, TorchPagedAttention(), torch.float32)
    with pytest.raises(ValueError, match="needs a .gguf model file"):
        assign_quantization(model, "gguf", None)
    types = {f"model.layers.{i}.{name}.weight": kind for i in range(2)
             for name, kind in [("self_attn.q_proj", "Q5_K"), ("self_attn.k_proj", "Q5_K"),
                                ("self_attn.v_proj", "Q2_K"), ("self_attn.o_proj", "Q4_0"),
                                ("mlp.gate_proj", "Q8_0"), ("mlp.up_proj", "Q8_0"), ("mlp.down_proj", "Q5_K")]}
    with caplog.at_level(logging.INFO, logger="llm_engine.layers.quant_config"):
        effective, keep = assign_quantization(model, "auto", types)
    assert effective["model.layers.0.self_attn.qkv_proj"] == "float"
    assert effective["model.layers.0.self_attn.o_proj"] == "gguf Q4_0 -> int4 g32 sym"
    assert effective["model.layers.1.mlp.gate_up_proj"] == "gguf Q8_0 -> int8 g32"
    assert effective["model.layers.1.mlp.down_proj"] == "float"
    assert "model.layers.1.mlp.up_proj.weight" in keep and "model.layers.1.mlp.down_proj.weight" not in keep
    assert "Q2_K/Q5_K, dequantized to float" in caplog.text


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_blocks_split_into_the_kernel_layout_without_changing_a_weight(kind):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize
    from gguf.quants import quantize as gguf_quantize

    from llm_engine.loader.gguf_weights import split_blocks

    qtype = GGMLQuantizationType[kind]
    w = (torch.randn(24, 96) * 0.1).numpy()
    blocks = gguf_quantize(w, qtype)
    parts = split_blocks(blocks, qtype)
    ours = dequantize(parts["qweight"], parts["scales"], parts.get("offsets"), 32)
    torch.testing.assert_close(ours, torch.from_numpy(gguf_dequantize(blocks, qtype).astype("float32")),
                               atol=1e-6, rtol=1e-6)
