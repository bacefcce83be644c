"""The built-in SmolLM2-135M-Instruct served standalone: 503 while it loads, API keys, real answers."""

from __future__ import annotations

import httpx
import openai
import pytest

from llm_engine.config import EngineConfig
from llm_engine.entrypoints.app import create_app
from llm_engine.entrypoints.models import BUILTIN_NAME, resolve_model
from llm_engine.entrypoints.service import ServerOptions

from .conftest import start_server

KEY = "sk-codeyard-test"


@pytest.fixture(scope="module")
def smol_server():
    path, name = resolve_model(None)
    assert name == BUILTIN_NAME
    app = create_app(EngineConfig(model=path, max_num_seqs=8), name, ServerOptions(api_keys=frozenset({KEY})))
    running = start_server(app)
    yield running
    running.stop()


def test_loading_then_serving_with_api_key(smol_server):
    headers = {"Authorization": f"Bearer {KEY}"}
    if not smol_server.service.engine.is_ready:  # the model takes seconds to load: 503 meanwhile
        r = httpx.post(smol_server.url + "/v1/completions", json={"model": BUILTIN_NAME, "prompt": "hi"},
                       headers=headers, timeout=10)
        assert r.status_code == 503 and "loading" in r.json()["error"]["message"]
        assert httpx.get(smol_server.url + "/health", timeout=10).status_code == 503
    smol_server.service.engine.wait_ready(600)
    assert httpx.get(smol_server.url + "/health", timeout=10).status_code == 200

    anonymous = openai.OpenAI(base_url=smol_server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        anonymous.models.list()
    assert httpx.get(smol_server.url + "/metrics", timeout=10).status_code == 401

    client = openai.OpenAI(base_url=smol_server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    out = client.chat.completions.create(
        model=BUILTIN_NAME, messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24, temperature=0)
    assert "Paris" in out.choices[0].message.content
    code = client.completions.create(model=BUILTIN_NAME, prompt="def add(a, b):\n    return", max_tokens=6,
                                     temperature=0, stop=["\n"])
    assert "a + b" in code.choices[0].text
