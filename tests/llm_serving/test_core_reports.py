"""The server's event loop reading the engine core's reports (`EngineCoreClient.start(loop)`), and
what runs in the wake-up that hands a step's first tokens to their clients."""

from __future__ import annotations

from multiprocessing.connection import Connection

import httpx

from .conftest import TINY_NAME


def test_the_loop_reads_each_report_without_looking_for_another(tiny_server, monkeypatch):
    """After a report the loop does not look for a further one (`Connection.poll` builds a selector
    per call, on the way from a step's report to the first writes); a further one is read on the
    loop's next pass, and a stream still gets every token."""
    polls: list[float] = []
    poll = Connection.poll

    def counting(self: Connection, timeout: float = 0.0) -> bool:
        polls.append(timeout)
        return poll(self, timeout)

    monkeypatch.setattr(Connection, "poll", counting)
    with httpx.stream("POST", tiny_server.url + "/v1/completions", timeout=60, json={
            "model": TINY_NAME, "prompt": "def read_loop(x):", "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "stream": True}) as answer:
        events = [line for line in answer.iter_lines() if line.startswith("data: ")]
    assert answer.status_code == 200 and events[-1] == "data: [DONE]"
    assert len(events) == 6 + 1  # one event a token here (one step each), then [DONE]
    assert polls == []
