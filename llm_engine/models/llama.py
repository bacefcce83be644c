"""Llama-family decoder (Llama, Mistral; Qwen2/Qwen3 subclass it) on the engine's layers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from llm_engine.layers.activation import SiluAndMul
from llm_engine.layers.attention import Attention, AttentionBackend
from llm_engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from llm_engine.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from llm_engine.layers.norm import RMSNorm
from llm_engine.layers.rotary import RotaryEmbedding

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def rope_parameters(config: PretrainedConfig) -> dict[str, Any]:
    """Rope settings from a transformers config (v5 `rope_parameters` or the older fields)."""
    rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    rope.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return rope


class LlamaAttention(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, dtype: torch.dtype, qkv_bias: bool,
                 o_bias: bool, qk_norm: bool) -> None:
        super().__init__()
        hidden = config.hidden_size
        num_heads = config.num_attention_heads
        num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
        head_dim = getattr(config, "head_dim", None) or hidden // num_heads
        self.qkv_proj = QKVParallelLinear(hidden, head_dim, num_heads, num_kv_heads, qkv_bias, dtype)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden, o_bias, dtype)
        self.rotary_emb = RotaryEmbedding(head_dim, config.max_position_embeddings, rope_parameters(config))
        self.q_norm = RMSNorm(head_dim, config.rms_norm_eps, dtype) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, config.rms_norm_eps, dtype) if qk_norm else None
        self.attn = Attention(self.num_heads, self.num_kv_heads, head_dim, head_dim ** -0.5, backend)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, metadata: object) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:  # both or neither
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k)
        out: torch.Tensor = self.o_proj(self.attn(q, k, v.contiguous(), metadata))
        return out


class LlamaMLP(nn.Module):
    def __init__(self, config: PretrainedConfig, dtype: torch.dtype) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [inter, inter], False, dtype)
        self.down_proj = RowParallelLinear(inter, hidden, False, dtype)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(self.act(self.gate_up_proj(x)))
        return out


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, dtype: torch.dtype, qkv_bias: bool,
                 o_bias: bool, qk_norm: bool) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, backend, dtype, qkv_bias, o_bias, qk_norm)
        self.mlp = LlamaMLP(config, dtype)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None,
                metadata: object) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, metadata)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        out: torch.Tensor = self.mlp(hidden)
        return out, residual


class LlamaModel(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, dtype: torch.dtype, qkv_bias: bool,
                 o_bias: bool, qk_norm: bool) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, dtype)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, backend, dtype, qkv_bias, o_bias, qk_norm)
            for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: object,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """`inputs_embeds` replaces the token embeddings (vision models put image features in)."""
        hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, metadata)
        normed: torch.Tensor = self.norm(hidden, residual)[0]
        return normed


class LlamaForCausalLM(nn.Module):
    """Checkpoint names follow Hugging Face; q/k/v and gate/up are loaded into fused matrices."""

    packed_modules = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"),
                      "v_proj": ("qkv_proj", "v"), "gate_proj": ("gate_up_proj", 0),
                      "up_proj": ("gate_up_proj", 1)}

    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, backend, dtype, *self.attention_options(config))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, dtype)
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        if self.tied:
            self.lm_head.tie(self.model.embed_tokens)

    @staticmethod
    def attention_options(config: PretrainedConfig) -> tuple[bool, bool, bool]:
        """(q/k/v bias, o_proj bias, per-head q/k RMSNorm)."""
        bias = bool(getattr(config, "attention_bias", False))
        return bias, bias, False

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: object) -> torch.Tensor:
        hidden: torch.Tensor = self.model(input_ids, positions, metadata)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors in; raise if any parameter of the model was not provided."""
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name or (self.tied and name.startswith("lm_head.")):
                continue
            for source, (target, shard) in self.packed_modules.items():
                if f".{source}." in name:
                    name = name.replace(f".{source}.", f".{target}.")
                    param = params[name]
                    param.weight_loader(param, tensor, shard)  # type: ignore[attr-defined]  # set by the fused layer
                    break
            else:
                if name not in params:
                    raise ValueError(f"model: checkpoint tensor {name!r} has no matching parameter")
                param = params[name]
                getattr(param, "weight_loader", _copy_loader)(param, tensor)
            loaded.add(name)
        if self.tied:  # the LM head shares the embedding's tensors
            loaded.update(name for name in params if name.startswith("lm_head."))
        missing = sorted(set(params) - loaded)
        if missing:
            raise ValueError(f"model: checkpoint lacks weights for {missing[:5]}")


def _copy_loader(param: nn.Parameter, tensor: torch.Tensor) -> None:
    if param.shape != tensor.shape:
        raise ValueError(f"model: weight shape {tuple(tensor.shape)} does not match {tuple(param.shape)}")
    param.data.copy_(tensor)
