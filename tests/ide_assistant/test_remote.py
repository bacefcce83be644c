"""CODEYARD_LLM_URL: the IDE loads no model and forwards /v1, /llm/metrics and the assistant to an
LLM server (here the standalone server's app over the session's SmolLM2), with that server's key;
an unreachable server or a refused key is a clear 503."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from assistant.remote import RemoteLLM
from ide_server.app import create_app
from ide_server.settings import Settings
from llm_engine.entrypoints.app import app_for
from llm_engine.entrypoints.models import BUILTIN_NAME
from tests.llm_serving.conftest import free_port, start_server

from .conftest import REMOTE_KEY
from .helpers import bodies, new_project, signed_in, stream_text, wait_idle


@pytest.fixture(scope="module")
def llm_server(smol_service) -> Iterator[str]:
    running = start_server(app_for(smol_service, own_service=False))
    yield running.url
    running.stop()


@contextmanager
def ide_using(tmp_path_factory, url: str, key: str) -> Iterator[FastAPI]:
    with pytest.MonkeyPatch.context() as env:  # read when the app starts its services
        env.setenv("CODEYARD_LLM_URL", url)
        env.setenv("CODEYARD_LLM_API_KEY", key)
        env.setenv("CODEYARD_ASSISTANT_ANSWER_TOKENS", "10")  # the model is real; the CPU is shared
        app = create_app(Settings(data_dir=tmp_path_factory.mktemp("remote-ide")))
        with TestClient(app):
            yield app
    app.state.engine.dispose()


@pytest.fixture(scope="module")
def remote_ide(tmp_path_factory, llm_server) -> Iterator[FastAPI]:
    with ide_using(tmp_path_factory, llm_server, REMOTE_KEY) as app:
        yield app


def test_v1_and_metrics_are_forwarded_to_the_llm_server(remote_ide):
    client = signed_in(remote_ide)
    models = client.get("/v1/models")
    assert models.status_code == 200 and models.json()["data"][0]["id"] == BUILTIN_NAME
    assert TestClient(remote_ide).get("/v1/models").status_code == 401  # never forwarded for anonymous callers
    out = client.post("/v1/completions", json={"model": BUILTIN_NAME, "prompt": "def add(a, b):\n    return a",
                                               "max_tokens": 3, "temperature": 0})
    assert out.status_code == 200 and "+" in out.json()["choices"][0]["text"]
    bad = client.post("/v1/completions", json={"model": BUILTIN_NAME, "prompt": "x", "max_tokens": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    metrics = client.get("/llm/metrics")
    assert metrics.status_code == 200 and "vllm:request_success_total" in metrics.text
    assert remote_ide.state.services.llm.service is None  # no model in this process


def test_the_assistant_runs_on_the_llm_server(remote_ide, smol_service):
    client = signed_in(remote_ide)
    project_id = new_project(client)
    base = f"/api/projects/{project_id}/assistant"
    assert client.get(base).json()["model"]["state"] == "ready"  # the LLM server's readiness
    r = client.post(f"{base}/complete", json=bodies()["complete"])
    assert r.status_code == 200 and "+ b" in r.json()["text"]
    wait_idle(smol_service)  # leaving the stream at the end of the line stopped it on the LLM server
    text, chunks = stream_text(client, f"{base}/chat", bodies()["chat"])
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant" and text.strip()
    assert remote_ide.state.services.llm.service is None


@pytest.mark.parametrize(("where", "message"), [("down", "unreachable"), ("wrong key", "refused this server's key")])
def test_an_llm_server_it_cannot_use_is_a_clear_503(tmp_path_factory, llm_server, where, message):
    url, key = (f"http://127.0.0.1:{free_port()}", REMOTE_KEY) if where == "down" else (llm_server, "sk-wrong")
    with ide_using(tmp_path_factory, url, key) as app:
        client = signed_in(app)
        v1 = client.get("/v1/models")
        assert v1.status_code == 503 and message in v1.json()["error"]["message"]
        project_id = new_project(client)
        status = client.get("/api/assistant/model").json()
        assert status["state"] == "failed" and message in status["detail"]
        r = client.post(f"/api/projects/{project_id}/assistant/complete", json=bodies()["complete"])
        assert r.status_code == 503 and message in r.json()["detail"]


async def test_requests_to_the_llm_server_reuse_a_kept_connection_and_one_left_early_is_closed(llm_server):
    remote = RemoteLLM(llm_server, REMOTE_KEY)

    async def local_port(path: str, read: bool) -> int:
        upstream = await remote.open("GET", path)
        if read:
            await upstream.response.aread()
        port = upstream.response.extensions["network_stream"].get_extra_info("client_addr")[1]
        await upstream.aclose()
        return port

    first = await local_port("/v1/models", read=True)
    assert await local_port("/v1/models", read=False) == first  # read to its end: kept, and reused
    assert await local_port("/v1/models", read=True) != first  # left before its end: closed
