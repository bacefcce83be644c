"""Request ids are drawn without a system call per request (`request_ids.new_request_id`): unique
within a process, random across processes, and the /v1 and /v2 routes name their engine requests
with them (before, `uuid.uuid4()` read os.urandom for every request on its way to `generate`;
gRPC's requests go through the same ServingV2 as /v2's).
The engine is the benchmark's stand-in (llm_api_cpu), recording what reaches it."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest

from benchmarks.llm_api_cpu import KEY, MODEL, StandInEngine
from llm_engine.engine_loop import AddRequest
from llm_engine.entrypoints import request_ids
from llm_engine.entrypoints.request_ids import new_request_id
from tests.llm_serving.test_hot_routes import _app, _call


def test_ids_are_unique_and_shaped_like_a_uuid_hex() -> None:
    ids = [new_request_id("cmpl") for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"cmpl-[0-9a-f]{32}", i) for i in ids)
    assert len({i[5:21] for i in ids}) == 1  # one random part per process


def test_another_process_draws_its_own_random_part(monkeypatch: pytest.MonkeyPatch) -> None:
    here = new_request_id("v2")
    child = os.getpid() + 1
    monkeypatch.setattr(request_ids.os, "getpid", lambda: child)  # as in a forked child
    there = new_request_id("v2")
    assert here[3:19] != there[3:19]


class _Recording(StandInEngine):
    def __init__(self) -> None:
        super().__init__(2)
        self.added: list[str] = []

    def _submit(self, command: Any) -> None:
        if isinstance(command, AddRequest):
            self.added.append(command.request_id)
        super()._submit(command)


@pytest.mark.parametrize(("path", "body", "prefix"), [
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2, "stream": True}, "cmpl"),
    (f"/v2/models/{MODEL}/generate_stream", {"text_input": "hi", "max_tokens": 2}, "v2"),
])
def test_a_request_reaches_the_engine_without_reading_the_os_randomness(
        monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any], prefix: str) -> None:
    app = _app(hot=True)
    engine = _Recording()
    app.state.llm.engine = engine
    new_request_id("warm")  # this process's random part is drawn once, before

    def no_urandom(_n: int) -> bytes:
        raise AssertionError("os.urandom read on a request's way to the engine")

    monkeypatch.setattr(os, "urandom", no_urandom)
    for _ in range(2):
        status, _headers, answer = _call(app, "POST", path, json.dumps(body).encode(), key=KEY)
        assert status == 200, answer
    assert len(engine.added) == 2 and len(set(engine.added)) == 2
    assert all(re.fullmatch(rf"{prefix}-[0-9a-f]{{32}}-0", i) for i in engine.added), engine.added
