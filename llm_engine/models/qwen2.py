"""Qwen2: the Llama decoder with biases on q/k/v (none on o_proj)."""

from __future__ import annotations

from llm_engine.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def attention_options(config) -> tuple[bool, bool, bool]:
        return True, False, False
