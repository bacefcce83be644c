"""Qwen3: the Llama decoder with per-head RMSNorm on q and k before rotary."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm_engine.models.llama import LlamaForCausalLM

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class Qwen3ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def attention_options(config: PretrainedConfig) -> tuple[bool, bool, bool]:
        bias = bool(getattr(config, "attention_bias", False))
        return bias, bias, True
