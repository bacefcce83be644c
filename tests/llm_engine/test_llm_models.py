"""Model registry (incl. entry-point plugins), checkpoint loading, the attention backend's paths."""

from __future__ import annotations

import json
import sys

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from llm_engine import LLM, SamplingParams
from llm_engine.layers import embedding, quantization
from llm_engine.layers.attention import _decode_attention
from llm_engine.layers.linear import LinearBase
from llm_engine.models.registry import resolve_model_class, supported_architectures


def test_registry_knows_the_four_architectures():
    assert {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
            "Qwen3ForCausalLM"} <= set(supported_architectures())
    with pytest.raises(ValueError, match="^model: architectures"):
        resolve_model_class(["BertForMaskedLM"])  # not a causal LM, so not even AutoDeploy takes it


def test_entry_point_plugin_adds_an_architecture(tiny_llama, tmp_path, monkeypatch):
    plugin = tmp_path / "plugin"
    (plugin / "my_models").mkdir(parents=True)
    (plugin / "my_models" / "__init__.py").write_text(
        "from llm_engine.models.llama import LlamaForCausalLM\n\n"
        "class MyLlama(LlamaForCausalLM):\n    pass\n")
    dist = plugin / "my_models-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-models\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[llm_engine.models]\nMyLlamaForCausalLM = my_models:MyLlama\n")
    monkeypatch.syspath_prepend(str(plugin))
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for file in tiny_llama.iterdir():
        (model_dir / file.name).write_bytes(file.read_bytes())
    config = json.loads((model_dir / "config.json").read_text())
    config["architectures"] = ["MyLlamaForCausalLM"]
    (model_dir / "config.json").write_text(json.dumps(config))
    llm = LLM(model=str(model_dir), dtype="float32")
    assert type(llm.engine.model_runner.model).__name__ == "MyLlama"
    reference = LLM(model=str(tiny_llama), dtype="float32")
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    assert (llm.generate([3, 4, 5], params, use_tqdm=False)[0].outputs[0].token_ids
            == reference.generate([3, 4, 5], params, use_tqdm=False)[0].outputs[0].token_ids)
    sys.modules.pop("my_models", None)


def test_sharded_checkpoint_has_an_index(tiny_llama):
    assert (tiny_llama / "model.safetensors.index.json").is_file()
    assert len(list(tiny_llama.glob("*.safetensors"))) > 1


def test_missing_weight_is_a_clear_error(tiny_llama, tmp_path):
    for file in tiny_llama.glob("*.json"):
        (tmp_path / file.name).write_bytes(file.read_bytes())
    index = json.loads((tiny_llama / "model.safetensors.index.json").read_text())
    for shard in set(index["weight_map"].values()):
        tensors = {k: v for k, v in load_file(tiny_llama / shard).items() if "down_proj" not in k}
        save_file(tensors, tmp_path / shard, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="^model: checkpoint lacks weights"):
        LLM(model=str(tmp_path), dtype="float32")


def test_blockwise_decode_attention_matches_sdpa():
    torch.manual_seed(0)
    batch, heads, kv_heads, blocks, block_size, dim = 3, 8, 2, 5, 4, 16
    q = torch.randn(batch, heads, dim)
    key_blocks = torch.randn(batch, blocks, kv_heads, block_size, dim)
    value_blocks = torch.randn(batch, blocks, kv_heads, block_size, dim)
    lengths = torch.tensor([[5], [20], [11]])
    mask = torch.arange(blocks * block_size).unsqueeze(0) < lengths
    keys = key_blocks.permute(0, 2, 1, 3, 4).flatten(2, 3)  # [B, kv_heads, context, dim]
    values = value_blocks.permute(0, 2, 1, 3, 4).flatten(2, 3)
    expected = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=mask.view(batch, 1, 1, -1),
                                              enable_gqa=True).squeeze(2)
    got = _decode_attention(q, key_blocks, value_blocks, mask, dim ** -0.5)
    assert torch.allclose(got, expected, atol=1e-5)
    got16 = _decode_attention(q.bfloat16(), key_blocks.bfloat16(), value_blocks.bfloat16(), mask, dim ** -0.5)
    assert torch.allclose(got16.float(), expected, atol=3e-2)


def test_sliding_window_caps_the_context(tmp_path):
    import transformers

    config = transformers.MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, sliding_window=48,
                                        max_position_embeddings=256)
    config.architectures = ["MistralForCausalLM"]
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    llm = LLM(model=str(tmp_path), dtype="float32")
    assert llm.engine.max_model_len == 48
    out = llm.generate([5] * 40, SamplingParams(max_tokens=20, ignore_eos=True), use_tqdm=False)[0]
    assert (len(out.outputs[0].token_ids), out.outputs[0].finish_reason) == (8, "length")


@pytest.mark.skipif(not quantization.onednn_bf16_available(), reason="this CPU has no oneDNN bf16 linear")
def test_bfloat16_weights_are_prepacked_for_onednn_and_change_no_token(tiny_llama, monkeypatch):
    prompts = [[5, 6, 7, 8, 9], list(range(10, 60))]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    llm = LLM(model=str(tiny_llama), dtype="bfloat16")
    model = llm.engine.model_runner.model
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    assert linears and all(m.packed_weight.is_mkldnn and not hasattr(m, "weight") for m in linears)
    assert model.lm_head.packed_weight is not None
    packed = [(out.outputs[0].token_ids, out.outputs[0].cumulative_logprob)
              for out in llm.generate(prompts, params, use_tqdm=False)]

    monkeypatch.setattr(quantization, "prepack", lambda weight: None)
    monkeypatch.setattr(embedding, "prepack", lambda weight: None)
    plain = LLM(model=str(tiny_llama), dtype="bfloat16")
    assert not hasattr(plain.engine.model_runner.model.model.layers[0].mlp.down_proj, "packed_weight")
    plain_outputs = plain.generate(prompts, params, use_tqdm=False)
    assert [(out.outputs[0].token_ids, out.outputs[0].cumulative_logprob) for out in plain_outputs] == packed
