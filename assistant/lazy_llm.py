"""The IDE's one LLM: loading in the background from start-up (or on first use), switched off, or
served by another server (CODEYARD_LLM_URL); and its status for the browser."""

from __future__ import annotations

import logging
import threading
import time
from functools import cached_property

from assistant.remote import RemoteLLM
from assistant.schemas import ModelStatus
from llm_engine import EngineConfig
from llm_engine.entrypoints import LLMService, OpenAIError, resolve_model
from llm_engine.multimodal.support import sees_images

log = logging.getLogger(__name__)

# Prompt lookup (issue 18) for the ghost-text completions, greedy lines that often copy code already
# in the prompt: the same suggestions for a little less (benchmarks/llm_spec_assistant.py, 64
# prompts: 1.03x CPU, median wait 1.07x; the prompt's prefill is most of a suggestion). Answers,
# sampled with a repetition penalty, draft too (each verify row is penalised over the draft before it).
PROMPT_LOOKUP = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 1}


class LazyLLM:
    """Creates and starts the LLMService when asked to load (at start-up unless deferred) or on first
    use, and returns at once: the model loads in the engine's own thread, so the server keeps
    answering (503 "model is loading" until it is ready). A bad model setting answers 503 with why.
    With `remote`, it stands for the LLM server that serves this app instead."""

    def __init__(self, setting: str | None, remote: RemoteLLM | None = None) -> None:
        self.setting = setting
        self.remote = remote
        self.service: LLMService | None = None
        self.error: str | None = None  # why the setting names no model we can load (the last try)
        self._lock = threading.Lock()
        self._loading = False  # load() was called: the engine is being set up
        self._since = time.monotonic()  # when loading began
        self._stopped = False

    def get(self) -> LLMService:
        if self.setting == "off":
            raise OpenAIError(503, "the LLM is switched off on this server (CODEYARD_LLM_MODEL=off)",
                              code="llm_disabled")
        with self._lock:
            if self._stopped:
                raise OpenAIError(503, "the server is stopping", code="llm_stopping")
            if self.service is None:
                if not self._loading:  # a first request's load
                    self._since = time.monotonic()
                try:
                    path, name = resolve_model(self.setting)
                except ValueError as exc:
                    self.error = f"the LLM is not available: {exc}"
                    raise OpenAIError(503, self.error, code="model_not_available") from None
                config = EngineConfig(model=path, max_num_seqs=32, speculative_config=PROMPT_LOOKUP)
                self.service = LLMService(config, name)
                self.service.start()
                self.error = None
            return self.service

    def load(self) -> None:
        """Start loading the model now (at start-up) and return at once: even setting the engine up
        (importing torch) takes seconds, so that too happens in a thread. Nothing to load for a remote
        or switched-off LLM; a setting that names no model is logged, and the status says why."""
        if self.remote is None and self.setting != "off" and not self._loading:
            self._loading, self._since = True, time.monotonic()
            threading.Thread(target=self._load, name="llm-load", daemon=True).start()

    def _load(self) -> None:
        try:
            self.get()
        except OpenAIError as exc:
            log.warning("%s", exc.message)

    @cached_property
    def sees_images(self) -> bool | None:
        """Whether the model takes images, read from its files without loading it; None for a remote
        LLM server's model (that server answers an image itself)."""
        if self.remote is not None:
            return None
        if self.setting == "off":
            return False
        try:
            return sees_images(resolve_model(self.setting)[0])
        except ValueError:
            return False

    @property
    def name(self) -> str:
        """The model's name as the assistant's messages give it."""
        try:
            return resolve_model(self.setting)[1]
        except ValueError:
            return str(self.setting)

    def status(self) -> ModelStatus:
        """Where the model stands (without starting a load: a status read must never load it), and
        whether it sees images."""
        return self._state().model_copy(update={"sees_images": self.sees_images})

    def _state(self) -> ModelStatus:
        """For a remote LLM, the LLM server's own readiness, asked with a short timeout."""
        if self.remote is not None:
            state, detail = self.remote.state()
            return ModelStatus(state=state, detail=detail)
        if self.setting == "off":
            return ModelStatus(state="off", detail="the LLM is switched off on this server")
        service = self.service
        if service is None:
            if self.error:
                return ModelStatus(state="failed", detail=self.error)
            if self._loading:
                return ModelStatus(state="loading", progress=0, detail="the model's engine is starting")
            return ModelStatus(state="deferred", detail="the model loads on the first request")
        engine = service.engine
        if engine.load_error:
            return ModelStatus(state="failed", detail=f"the model failed to load: {engine.load_error}")
        if not engine.is_ready:
            seconds = round(time.monotonic() - self._since)
            return ModelStatus(state="loading", progress=engine.load_progress,
                               detail=f"the model is loading ({engine.load_progress}%, {seconds} s so far)")
        return ModelStatus(state="ready", progress=100, detail=f"{service.served_name} is ready")

    def stop(self) -> None:
        """Stop the engine, and any load still setting it up (it waits for the setup, then stops it)."""
        self._stopped = True
        with self._lock:
            if self.service is not None:
                self.service.stop()
