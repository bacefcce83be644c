"""Tiny random-weight models of architectures the engine has no model file for, built on the
spot with Transformers (2 layers, hidden 64), and their greedy reference tokens."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

VOCAB = 256
# model_type -> overrides that reach the architecture's special paths at this size
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "gemma2": {"head_dim": 16, "sliding_window": 6, "query_pre_attn_scalar": 16,  # window, soft-capping, tied
               "initializer_range": 0.02},
    "phi3": {},  # fused qkv and gate_up projections
    "stablelm": {"partial_rotary_factor": 0.25},  # LayerNorm, partial rotary
    "olmo2": {},  # q/k norms over all heads, post-norms
    "gpt_neox": {"rotary_pct": 0.5},  # parallel residual, fused qkv, LayerNorm, GELU
    "phi": {},  # partial rotary (half of each head by default), parallel block, biases
    "granite": {"embedding_multiplier": 2.0, "residual_multiplier": 0.5, "logits_scaling": 4.0},
    "starcoder2": {"sliding_window": 8},  # biases, LayerNorm, GELU MLP, window
    "cohere": {"use_qk_norm": False, "logit_scale": 0.5},  # parallel block, LayerNorm without bias
}


def build(model_type: str, folder: Path, **overrides: Any) -> Path:
    settings: dict[str, Any] = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                    max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                    initializer_range=0.2)  # 0.02 makes some tiny models repeat one token
    settings.update(ARCHITECTURES.get(model_type, {}), **overrides)
    config = AutoConfig.for_model(model_type, **settings)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # zero-initialised norms/biases would hide a wrongly loaded one
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(folder)
    return folder


def prompts(seed: int = 7) -> list[list[int]]:
    """Mixed lengths; the last shares 3 blocks of 4 tokens with the first (prefix-cache hits)."""
    rng = random.Random(seed)
    out = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (14, 5, 1, 9)]
    out[3] = out[0][:12] + out[3]
    return out


def hf_greedy(folder: Path, batch: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    results = []
    for prompt in batch:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        results.append(out[0, len(prompt):].tolist())
    return results


def run_cli(*argv: str) -> int:
    """`codeyard llm ARGV...`'s exit code."""
    from ide_server.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["llm", *argv])
    return int(exit_info.value.code or 0)


def hand_written_llama(folder: Path) -> Any:
    """A tiny Llama checkpoint loaded into the engine's own model class (no capture: ~1 s), for
    the passes that take any engine model (sensitivity, dtype trials)."""
    from llm_engine.layers.attention import TorchPagedAttention
    from llm_engine.loader import ModelSource
    from llm_engine.models.llama import LlamaForCausalLM

    source = ModelSource(str(build("llama", folder)))
    config = source.hf_config()
    model = LlamaForCausalLM(config, TorchPagedAttention(), torch.float32)
    model.load_weights(source.weights(config))
    return model
