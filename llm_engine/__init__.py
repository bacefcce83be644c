"""Codeyard's LLM engine: paged KV cache, prefix caching, continuous batching, vLLM-shaped API.

The names below are imported on first use, so that importing a light submodule (the IDE's /v1
glue, configs, sampling params) does not pull in torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm_engine.async_engine import AsyncLLMEngine, EngineNotReady, EngineOverloaded
    from llm_engine.beam_search import BeamSearchParams
    from llm_engine.config import EngineConfig
    from llm_engine.llm import LLM
    from llm_engine.llm_engine import EngineStats, LLMEngine
    from llm_engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
    from llm_engine.sampling_params import SamplingParams
    from llm_engine.sequence import SequenceStatus
    from llm_engine.structured_outputs import StructuredOutputsParams

_EXPORTS = {
    "LLM": "llm_engine.llm", "LLMEngine": "llm_engine.llm_engine", "EngineConfig": "llm_engine.config",
    "EngineStats": "llm_engine.llm_engine", "SamplingParams": "llm_engine.sampling_params",
    "RequestOutput": "llm_engine.outputs", "CompletionOutput": "llm_engine.outputs",
    "RequestMetrics": "llm_engine.outputs", "Logprob": "llm_engine.outputs", "SequenceStatus": "llm_engine.sequence",
    "AsyncLLMEngine": "llm_engine.async_engine", "EngineNotReady": "llm_engine.async_engine",
    "EngineOverloaded": "llm_engine.async_engine", "BeamSearchParams": "llm_engine.beam_search",
    "StructuredOutputsParams": "llm_engine.structured_outputs",
}
__all__ = ["LLM", "LLMEngine", "EngineConfig", "EngineStats", "SamplingParams", "RequestOutput", "CompletionOutput",
           "RequestMetrics", "Logprob", "SequenceStatus", "AsyncLLMEngine", "EngineNotReady", "EngineOverloaded",
           "BeamSearchParams", "StructuredOutputsParams"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'llm_engine' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
