"""/v1 inside the IDE server: signed-in users only, the model loads on first use (503 meanwhile)."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from ide_server.app import create_app
from ide_server.settings import Settings

from .conftest import start_server


@pytest.fixture(scope="module")
def ide(tmp_path_factory, tiny_chat_model):
    settings = Settings(data_dir=tmp_path_factory.mktemp("ide-data"), llm_model=str(tiny_chat_model))
    running = start_server(create_app(settings))
    yield running
    running.stop()
    running.app.state.engine.dispose()


def personal_token(url: str) -> str:
    with httpx.Client(base_url=url, timeout=30) as c:
        csrf = c.post("/api/auth/register", json={"username": "llmuser", "password": "pass-word-1"}).json()["csrf_token"]
        return c.post("/api/tokens", json={"name": "llm"}, headers={"X-CSRF-Token": csrf}).json()["token"]


def test_anonymous_callers_get_401(ide):
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                         ("GET", "/llm/metrics")):
        r = httpx.request(method, ide.url + path, json={"model": "x", "prompt": "hi"}, timeout=10)
        assert r.status_code == 401, (path, r.text)
    bad = httpx.get(ide.url + "/v1/models", headers={"Authorization": "Bearer nope"}, timeout=10)
    assert bad.status_code == 401


def test_signed_in_user_gets_503_while_loading_then_answers(ide, tiny_chat_model):
    client = openai.OpenAI(base_url=ide.url + "/v1", api_key=personal_token(ide.url), max_retries=0, timeout=60)
    name = tiny_chat_model.name
    with pytest.raises(openai.InternalServerError) as info:  # the first call starts the load
        client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 503 and "loading" in info.value.body["message"]
    assert httpx.get(ide.url + "/healthz", timeout=10).status_code == 200  # the IDE stays usable
    deadline = time.monotonic() + 120
    while not client.models.list().data[0].model_extra["ready"]:
        assert time.monotonic() < deadline, "model did not load"
        time.sleep(0.2)
    out = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                         extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 3
    by_path = client.completions.create(model=str(tiny_chat_model), prompt="x", max_tokens=2)
    assert by_path.choices[0].text is not None



def test_v2_in_the_ide_needs_sign_in_like_v1(ide, tiny_chat_model):
    import numpy as np
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(ide.url.removeprefix("http://"))
    assert not client.is_server_ready()  # 401 without a token
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata(tiny_chat_model.name)
    assert info.value.status() == "401"
    with httpx.Client(base_url=ide.url, timeout=30) as c:
        csrf = c.post("/api/auth/register", json={"username": "v2user", "password": "pass-word-1"}).json()["csrf_token"]
        token = c.post("/api/tokens", json={"name": "v2"}, headers={"X-CSRF-Token": csrf}).json()["token"]
    headers = {"Authorization": f"Bearer {token}"}
    assert client.is_model_ready(tiny_chat_model.name, headers=headers)
    text = httpclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"hi"]], dtype=object))
    limit = httpclient.InferInput("max_tokens", [1, 1], "INT32")
    limit.set_data_from_numpy(np.array([[2]], dtype=np.int32))
    result = client.infer(tiny_chat_model.name, [text, limit], headers=headers)
    assert result.as_numpy("num_output_tokens").reshape(-1)[0] >= 1
