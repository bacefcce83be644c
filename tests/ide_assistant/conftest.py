"""The built-in SmolLM2, loaded once per test session and lent to each module's app.

Apps here run on SQLite only: the assistant's table is covered on PostgreSQL by the switch
tests (which use the shared two-backend `app` fixture and never load the model).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from assistant.service import Assistant, AssistantConfig
from ide_server.app import create_app
from ide_server.settings import Settings
from llm_engine.config import EngineConfig
from llm_engine.entrypoints.models import resolve_model
from llm_engine.entrypoints.service import LLMService, ServerOptions

# Short answers: the model is real and the test machine's CPU is shared.
TEST_CONFIG = AssistantConfig(rate_per_minute=1, burst=5, completion_tokens=12, answer_tokens=10)
REMOTE_KEY = "sk-assistant-test"  # the key the model asks for when served over HTTP (test_remote)


@pytest.fixture(scope="session")
def smol_service() -> Iterator[LLMService]:
    path, name = resolve_model(None)
    service = LLMService(EngineConfig(model=path, max_num_seqs=8), name,
                         ServerOptions(api_keys=frozenset({REMOTE_KEY})))
    service.start()
    service.engine.wait_ready(600)
    yield service
    service.stop()


@pytest.fixture(scope="module")
def model_app(tmp_path_factory, smol_service) -> Iterator[FastAPI]:
    """An IDE app (SQLite) whose lazy LLM is the session's loaded model, with TEST_CONFIG limits."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("assistant-data"))
    app = create_app(settings)
    with TestClient(app):
        app.state.services.llm.service = smol_service
        app.state.services.assistant = Assistant(app.state.services.llm, TEST_CONFIG)
        yield app
        app.state.services.llm.service = None  # the session's model outlives this app
    app.state.engine.dispose()
