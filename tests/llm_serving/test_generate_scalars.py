"""/v2 generate and generate_stream build a body of single values into the request directly
(`kserve_http._scalar_request`), not through numpy tensors and back; whatever the body, the
request (or the error) is the one the tensor path builds."""

from __future__ import annotations

import json
import types
from typing import Any

import pytest

from benchmarks.llm_api_cpu import KEY, MODEL
from llm_engine.entrypoints import kserve
from llm_engine.entrypoints.kserve_http import _generate_requests, _generate_tensors, _scalar_request
from llm_engine.entrypoints.protocol import OpenAIError
from tests.llm_serving.test_hot_routes import _app, _call

SERVICE: Any = types.SimpleNamespace(served_name=MODEL)
PROMPT = {"text_input": "def fib(n):"}

BODIES: list[Any] = [
    {**PROMPT, "max_tokens": 64, "temperature": 0, "ignore_eos": True},  # the benchmark's
    {**PROMPT, "temperature": 0.1, "top_p": 0.9, "repetition_penalty": 1.1, "top_k": 5, "seed": 7},
    {**PROMPT, "temperature": 2, "min_tokens": 2, "max_tokens": 3, "stop": "\n"},
    {**PROMPT, "stop": ["a", "b"], "id": "x", "parameters": {"max_tokens": 5, "temperature": 0.5}},
    {**PROMPT, "max_tokens": 9, "parameters": {"max_tokens": 5, "top_k": 3, "stream": True}},
    {**PROMPT, "stream": True}, {**PROMPT, "stream": False}, {**PROMPT, "stream": 1},
    {**PROMPT, "temperature": "hot"}, {**PROMPT, "max_tokens": "5"}, {**PROMPT, "max_tokens": True},
    {**PROMPT, "max_tokens": 2 ** 40}, {**PROMPT, "seed": 2 ** 70}, {**PROMPT, "max_tokens": -1},
    {**PROMPT, "top_p": 1e40}, {**PROMPT, "top_p": 0}, {**PROMPT, "ignore_eos": "yes"},
    {**PROMPT, "ignore_eos": 0}, {**PROMPT, "max_tokens": 2.5}, {**PROMPT, "max_tokens": [3]},
    {"text_input": ["a", "b"]}, {"text_input": [["a"], ["b"]], "max_tokens": [[2], [3]]},
    {"text_input": "\ud800"}, {"text_input": 5}, {"text_input": ""}, {"max_tokens": 3}, {**PROMPT, "nope": 1},
    {**PROMPT, "image_bytes_input": "x"}, {**PROMPT, "parameters": []}, {**PROMPT, "parameters": {"nope": 1}},
    [PROMPT], "text",
]


def _through_tensors(body: Any, streaming: bool) -> list[Any]:
    tensors, parameters = _generate_tensors(body)
    if streaming:
        tensors.pop("stream", None)
    return kserve.requests_from_tensors(SERVICE, tensors, parameters)


def _outcome(build: Any) -> Any:
    try:
        return [request.model_dump() for request in build()]
    except OpenAIError as exc:
        return (exc.status, exc.message, exc.param)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # numpy's, on top_p 1e40
@pytest.mark.parametrize("streaming", [True, False])
@pytest.mark.parametrize("body", BODIES, ids=[str(i) for i in range(len(BODIES))])
def test_the_same_request_or_error_as_through_tensors(body: Any, streaming: bool) -> None:
    assert _outcome(lambda: _generate_requests(SERVICE, body, streaming)) == \
        _outcome(lambda: _through_tensors(body, streaming))


def test_single_values_skip_the_tensors() -> None:
    for body in [*BODIES[:3], BODIES[4]]:  # [3] has a list (stop), for the tensors
        assert _scalar_request(SERVICE, body, streaming=True) is not None
    assert _scalar_request(SERVICE, BODIES[0], streaming=False) is not None
    assert _scalar_request(SERVICE, {**PROMPT, "stream": True}, streaming=False) is None  # refused there


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_a_plain_request_builds_no_tensor(monkeypatch: pytest.MonkeyPatch, route: str) -> None:
    def no_tensors(*_args: Any) -> Any:
        raise AssertionError("a tensor was built")

    monkeypatch.setattr(kserve, "decode_json", no_tensors)
    status, _headers, answer = _call(_app(hot=True), "POST", f"/v2/models/{MODEL}/{route}",
                                     json.dumps(BODIES[0]).encode(), key=KEY)
    assert status == 200, answer
