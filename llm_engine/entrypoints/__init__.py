"""The OpenAI-compatible HTTP server over AsyncLLMEngine (standalone app and IDE component)."""
