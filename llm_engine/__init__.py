"""Codeyard's LLM engine: paged KV cache, prefix caching, continuous batching, vLLM-shaped API.

The names below are imported on first use, so that importing a light submodule (the IDE's /v1
component, configs, sampling params) does not pull in torch.
"""

from importlib import import_module

_EXPORTS = {
    "LLM": "llm_engine.llm", "LLMEngine": "llm_engine.llm_engine", "EngineConfig": "llm_engine.config",
    "EngineStats": "llm_engine.llm_engine", "SamplingParams": "llm_engine.sampling_params",
    "RequestOutput": "llm_engine.outputs", "CompletionOutput": "llm_engine.outputs",
    "RequestMetrics": "llm_engine.outputs", "Logprob": "llm_engine.outputs", "SequenceStatus": "llm_engine.sequence",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'llm_engine' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
