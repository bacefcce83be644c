"""The standalone server's inference POSTs answered ahead of FastAPI's router (`HotRoutes`): they skip
FastAPI's routing and dependencies, and a client sees the same answers either way (statuses, bodies,
headers), errors included: bad JSON, bad fields, unknown models and versions, missing or wrong keys,
another method, a versioned path. The engine is the benchmark's stand-in (llm_api_cpu)."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from fastapi import Request

from benchmarks.llm_api_cpu import KEY, MODEL, StandInEngine, asgi_request
from llm_engine.config import EngineConfig
from llm_engine.entrypoints import app as app_module
from llm_engine.entrypoints.service import LLMService, ServerOptions

V1 = "/v1/completions"
V2 = f"/v2/models/{MODEL}"


def _app(hot: bool, tokens: int = 2) -> Any:
    service = LLMService(EngineConfig(model=MODEL), MODEL, ServerOptions(api_keys=frozenset({KEY})))
    service.engine = StandInEngine(tokens)
    return app_module.app_for(service, own_service=False, hot_routes=hot)


def _call(app: Any, method: str, path: str, body: bytes = b"", key: str | None = KEY,
          root_path: str = "") -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request driven through the app's ASGI interface."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(asgi_request(app, method, path, body, send, key=key, root_path=root_path))
    start = next(m for m in sent if m["type"] == "http.response.start")
    answer = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start.get("headers", [])}, answer


def _same_apart_from_ids(answer: bytes) -> bytes:
    """Request ids and creation times differ from call to call; nothing else may."""
    answer = re.sub(rb'"id": ?"(chat)?cmpl-[0-9a-f]+"', b'"id": "_"', answer)
    return re.sub(rb'"created": ?\d+', b'"created": "_"', answer)


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


CASES = [
    ("POST", V1, _json({"model": MODEL, "prompt": "hi", "max_tokens": 2, "stream": True}), KEY),
    ("POST", V1, _json({"model": MODEL, "prompt": "hi", "max_tokens": 2}), KEY),
    ("POST", V1, b"{not json", KEY),
    ("POST", V1, _json({"model": MODEL, "prompt": "hi", "max_tokens": -1}), KEY),
    ("POST", V1, _json({"model": "other", "prompt": "hi"}), KEY),
    ("POST", V1, _json({"model": MODEL, "prompt": "hi"}), None),
    ("POST", V1, _json({"model": MODEL, "prompt": "hi"}), "wrong"),
    ("GET", V1, b"", KEY),
    ("POST", V1 + "/", _json({"model": MODEL, "prompt": "hi", "max_tokens": 2}), KEY),
    ("POST", "/v1/chat/completions", _json({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}), KEY),
    ("POST", "/v1/chat/completions", _json({"model": MODEL, "messages": "hi"}), KEY),
    ("POST", f"{V2}/generate", _json({"text_input": "hi", "max_tokens": 2, "id": "7"}), KEY),
    ("POST", f"{V2}/versions/1/generate", _json({"text_input": "hi", "max_tokens": 2}), KEY),
    ("POST", f"{V2}/versions/9/generate", _json({"text_input": "hi", "max_tokens": 2}), KEY),
    ("POST", f"{V2}/generate_stream", _json({"text_input": "hi", "max_tokens": 2}), KEY),
    ("POST", f"{V2}/generate_stream", _json({"text_input": "hi", "temperature": "hot"}), KEY),
    ("POST", f"{V2}/generate", _json({"text_input": "hi", "nope": 1}), KEY),
    ("POST", "/v2/models/other/generate", _json({"text_input": "hi"}), KEY),
    ("POST", f"{V2}/generate", _json({"text_input": "hi"}), None),
    ("POST", f"{V2}/infer", _json({"id": "3", "inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": ["hi"]},
        {"name": "max_tokens", "datatype": "INT32", "shape": [1, 1], "data": [2]}]}), KEY),
    ("POST", f"{V2}/infer", _json({"inputs": "x"}), KEY),
    ("POST", f"{V2}/infer", b"[1]", KEY),
    ("GET", f"{V2}/infer", b"", KEY),
]


@pytest.mark.parametrize(("method", "path", "body", "key"), CASES,
                         ids=[f"{m} {p} {b[:40]!r} {k}" for m, p, b, k in CASES])
def test_a_client_sees_the_same_answers_as_through_fastapi(method, path, body, key):
    hot, plain = (_call(_app(flag), method, path, body, key) for flag in (True, False))
    assert hot[0] == plain[0]
    assert hot[1] == plain[1]
    assert _same_apart_from_ids(hot[2]) == _same_apart_from_ids(plain[2])


def test_the_answers_are_the_protocols():
    """Spot checks that the comparison above compares answers, not two failures."""
    status, headers, body = _call(_app(True), "POST", V1, CASES[0][2])
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert body.count(b"data: ") == 3 and body.endswith(b"data: [DONE]\n\n")
    status, _, body = _call(_app(True), "POST", V1, CASES[0][2], key=None)
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    status, _, body = _call(_app(True), "POST", f"{V2}/generate", _json({"text_input": "hi"}), key=None)
    assert status == 401 and set(json.loads(body)) == {"error"}
    status, _, body = _call(_app(True), "POST", f"{V2}/versions/1/generate", CASES[12][2])
    assert status == 200 and json.loads(body)["text_output"] == "xx"
    assert _call(_app(True), "GET", V1)[0] == 405


def test_the_inference_routes_skip_fastapis_dependencies(monkeypatch):
    """Through HotRoutes the route's dependencies (the key guard) are not solved; elsewhere they are,
    and with hot_routes=False every route goes through them."""
    solved: list[str] = []

    async def guard(request: Request) -> None:
        solved.append(request.url.path)
        app_module.check_bearer(request, request.app.state.llm.options.api_keys)

    monkeypatch.setattr(app_module, "_api_key_guard", guard)
    body = _json({"model": MODEL, "prompt": "hi", "max_tokens": 2})
    hot = _app(True)
    assert _call(hot, "POST", V1, body)[0] == 200
    assert _call(hot, "POST", f"{V2}/generate", _json({"text_input": "hi"}))[0] == 200
    assert solved == []
    assert _call(hot, "GET", "/v1/models")[0] == 200
    assert solved == ["/v1/models"]
    assert _call(_app(False), "POST", V1, body)[0] == 200
    assert solved == ["/v1/models", V1]


def test_behind_a_root_path_as_through_fastapi(monkeypatch):
    """uvicorn --root-path /llm: the path a route sees drops the prefix, as Starlette's routing drops it."""
    solved: list[str] = []

    async def guard(request: Request) -> None:
        solved.append(request.url.path)

    monkeypatch.setattr(app_module, "_api_key_guard", guard)
    body = _json({"model": MODEL, "prompt": "hi", "max_tokens": 1})
    hot, plain = (_call(_app(flag), "POST", "/llm" + V1, body, root_path="/llm") for flag in (True, False))
    assert hot[0] == plain[0] == 200 and solved == ["/llm" + V1]  # only FastAPI's call solved the guard
    assert _same_apart_from_ids(hot[2]) == _same_apart_from_ids(plain[2])


def test_the_inference_routes_skip_fastapis_middleware_but_are_still_counted(monkeypatch):
    """ServerApp answers the inference POSTs before FastAPI's middleware stack (its error, telemetry,
    body-limit and exception layers, and any middleware added to the app): a middleware added to the
    app sees every other request, none of those; and those are still counted as on their way to the
    engine and wait for a burst as alone (`admitted`), once each."""
    seen: list[str] = []

    class Seen:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                seen.append(f"{scope['method']} {scope['path']}")
            await self.app(scope, receive, send)

    waits: list[int] = []
    app = _app(True)
    engine = app.state.llm.engine
    real_wait = engine.wait_for_burst

    async def wait_for_burst() -> None:
        waits.append(engine._admitting)
        await real_wait()

    monkeypatch.setattr(engine, "wait_for_burst", wait_for_burst)
    app.add_middleware(Seen)
    body = _json({"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert _call(app, "POST", V1, body)[0] == 200
    assert _call(app, "POST", f"{V2}/generate_stream", _json({"text_input": "hi"}))[0] == 200
    assert _call(app, "POST", V1, body, key="wrong")[0] == 401
    assert seen == [] and waits == [1, 1, 1]
    assert _call(app, "GET", "/v1/models")[0] == 200
    assert _call(app, "POST", "/v1/models", b"{}")[0] == 405  # a POST FastAPI answers: counted there
    assert seen == ["GET /v1/models", "POST /v1/models"] and waits == [1, 1, 1, 1]
    assert engine._admitting == 0
