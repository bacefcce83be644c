"""Codeyard's LLM engine: paged KV cache, prefix caching, continuous batching, vLLM-shaped API."""

from llm_engine.config import EngineConfig
from llm_engine.llm import LLM
from llm_engine.llm_engine import EngineStats, LLMEngine
from llm_engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from llm_engine.sampling_params import SamplingParams
from llm_engine.sequence import SequenceStatus

__all__ = ["LLM", "LLMEngine", "EngineConfig", "EngineStats", "SamplingParams", "RequestOutput",
           "CompletionOutput", "RequestMetrics", "Logprob", "SequenceStatus"]
