"""Qwen2: the Llama decoder with biases on q/k/v (none on o_proj)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm_engine.models.llama import LlamaForCausalLM

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class Qwen2ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def attention_options(config: PretrainedConfig) -> tuple[bool, bool, bool]:
        return True, False, False
