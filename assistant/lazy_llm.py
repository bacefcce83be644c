"""The IDE's one LLM: loaded on first use, switched off, or served by another server (CODEYARD_LLM_URL)."""

from __future__ import annotations

import threading

from assistant.remote import RemoteLLM
from llm_engine import EngineConfig
from llm_engine.entrypoints import LLMService, OpenAIError, resolve_model


class LazyLLM:
    """Creates and starts the LLMService on first use (a bad model setting answers 503 with why);
    or, with `remote`, stands for the LLM server that serves this app instead."""

    def __init__(self, setting: str | None, remote: RemoteLLM | None = None) -> None:
        self.setting = setting
        self.remote = remote
        self.service: LLMService | None = None
        self._lock = threading.Lock()

    def get(self) -> LLMService:
        if self.setting == "off":
            raise OpenAIError(503, "the LLM is switched off on this server (CODEYARD_LLM_MODEL=off)",
                              code="llm_disabled")
        with self._lock:
            if self.service is None:
                try:
                    path, name = resolve_model(self.setting)
                except ValueError as exc:
                    raise OpenAIError(503, f"the LLM is not available: {exc}", code="model_not_available") from None
                # No prompt lookup yet: verifying a draft still costs more than the tokens it saves
                # here (benchmarks/llm_spec.py: 0.45x on code edits), so it stays opt-in.
                config = EngineConfig(model=path, max_num_seqs=32)
                self.service = LLMService(config, name)
                self.service.start()
            return self.service

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()
