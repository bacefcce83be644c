"""The LLM as an IDE-server component: /v1 (OpenAI API) and /llm/metrics for signed-in users.

The model (CODEYARD_LLM_MODEL: a local folder or .gguf; unset means the built-in SmolLM2; "off"
disables it) loads in the background on first use, so the IDE starts at once and stays usable:
until the model is ready /v1 answers 503 "model is loading". Callers sign in as for /api: a
session cookie (with the CSRF header on POST) or a personal API token as Bearer.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request

from ide_server.components import Component
from ide_server.deps import require_user
from llm_engine.config import EngineConfig
from llm_engine.entrypoints import api
from llm_engine.entrypoints.models import resolve_model
from llm_engine.entrypoints.protocol import OpenAIError
from llm_engine.entrypoints.service import LLMService


class LazyLLM:
    """Creates and starts the LLMService on first use (a bad model setting answers 503 with why)."""

    def __init__(self, setting: str | None) -> None:
        self.setting = setting
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
                self.service = LLMService(EngineConfig(model=path, max_num_seqs=32), name)
                self.service.start()
            return self.service

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()


def llm_of(app: FastAPI) -> LazyLLM:
    return app.state.llm_lazy


def _service(request: Request) -> LLMService:
    return llm_of(request.app).get()


def _setup(app: FastAPI) -> None:
    app.state.llm_lazy = LazyLLM(app.state.settings.llm_model)
    api.install(app)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    try:
        yield
    finally:
        llm_of(app).stop()


router = api.build_router(_service, Depends(require_user), metrics_path="/llm/metrics")
component = Component(name="llm", router=router, setup=_setup, lifespan=_lifespan)
