"""CODEYARD_LLM_EAGER (the default outside tests): the model starts loading when the server starts, in
the background, so the app answers at once, the status says "loading" until the model is ready, and the
first Explain after that answers; a model setting that names nothing is a "failed" status saying why.
(A tiny random model with a byte-level tokenizer made on the spot: loading it is what is tested, not its words.)"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from tiny_llm import save_tiny_chat_llama

from ide_server.app import create_app
from ide_server.settings import Settings

from .helpers import bodies, new_project, signed_in, stream_text

COMPONENTS = ["ide_server.api.health:component", "ide_server.api.accounts:component",
              "ide_server.api.projects:component", "assistant.api.llm:component", "assistant.api.assistant:component"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return save_tiny_chat_llama(tmp_path_factory.mktemp("tiny-eager"))


@pytest.fixture
def eager_app(tmp_path_factory, monkeypatch) -> Iterator[Callable[[str], FastAPI]]:
    """Factory: a started app (lifespan run) whose model setting is `model`, loading eagerly."""
    apps: list[tuple[FastAPI, TestClient]] = []
    monkeypatch.setenv("CODEYARD_ASSISTANT_ANSWER_TOKENS", "8")  # the words are not what is tested

    def start(model: str) -> FastAPI:
        app = create_app(Settings(data_dir=tmp_path_factory.mktemp("eager"), llm_model=model, llm_eager=True),
                         component_specs=COMPONENTS)
        serving = TestClient(app)
        serving.__enter__()
        apps.append((app, serving))
        return app

    yield start
    for app, serving in apps:
        serving.__exit__(None, None, None)
        app.state.engine.dispose()


def statuses_until_settled(client: TestClient, timeout: float = 120) -> list[dict]:
    """The model statuses read every 0.1 s until it is no longer loading."""
    seen: list[dict] = []
    deadline = time.monotonic() + timeout
    while not seen or seen[-1]["state"] == "loading":
        assert time.monotonic() < deadline, seen[-1]
        seen.append(client.get("/api/assistant/model").json())
        time.sleep(0.1)
    return seen


def test_the_model_loads_from_start_up_and_the_first_explain_answers(eager_app, tiny_model: Path) -> None:
    app = eager_app(str(tiny_model))
    client = signed_in(app)  # the server answers while the model loads
    project_id = new_project(client)
    seen = statuses_until_settled(client)
    assert {s["state"] for s in seen} <= {"loading", "ready"}, seen  # never "deferred": nobody asked for it
    assert seen[-1] == {"state": "ready", "detail": f"{tiny_model.name} is ready", "progress": 100, "sees_images": False}
    loading = [s for s in seen if s["state"] == "loading"]
    assert all(s["progress"] in (0, 10) for s in loading), loading
    assert client.get(f"/api/projects/{project_id}/assistant").json()["model"] == seen[-1]
    text, chunks = stream_text(client, f"/api/projects/{project_id}/assistant/explain", bodies()["explain"])
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_model_setting_that_names_nothing_is_a_failed_status(eager_app, tmp_path: Path) -> None:
    app = eager_app(str(tmp_path / "no-such-model"))
    client = signed_in(app)
    seen = statuses_until_settled(client)
    assert seen[-1]["state"] == "failed" and "no-such-model' does not exist" in seen[-1]["detail"], seen
    r = client.post(f"/api/projects/{new_project(client)}/assistant/explain", json=bodies()["explain"])
    assert r.status_code == 503 and "does not exist" in r.json()["detail"]
    assert TestClient(app).get("/api/assistant/model").status_code == 401  # signed-in users only
