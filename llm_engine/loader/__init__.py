"""Find a model's config, weights and tokenizer in a local folder, GGUF file or built engine folder
(never a hub)."""

from llm_engine.loader.source import ModelSource

__all__ = ["ModelSource"]
