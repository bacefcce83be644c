"""Qwen3: the Llama decoder with per-head RMSNorm on q and k before rotary."""

from __future__ import annotations

from llm_engine.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def attention_options(config) -> tuple[bool, bool, bool]:
        bias = bool(getattr(config, "attention_bias", False))
        return bias, bias, True
