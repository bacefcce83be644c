"""Find a model's config, weights and tokenizer in a local folder or GGUF file (never a hub)."""

from llm_engine.loader.source import ModelSource

__all__ = ["ModelSource"]
