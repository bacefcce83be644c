"""How a request that reaches an idle engine alone decides whether it is the first of a burst
(`RequestStreams.wait_for_burst`), driven through a stand-in engine that records the commands."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from llm_engine import SamplingParams, request_streams
from llm_engine.engine_loop import AddRequest, Command
from llm_engine.request_streams import RequestStreams


class Recorder(RequestStreams):
    def __init__(self) -> None:
        super().__init__(max_waiting=100, on_step=None)
        self.sent: list[Command] = []

    def _submit(self, command: Command) -> None:
        self.sent.append(command)

    def check_ready(self) -> None:
        pass

    def adds(self) -> dict[str, bool]:
        """Each request sent to the engine, and whether it said more follow."""
        return {c.request_id: c.more for c in self.sent if isinstance(c, AddRequest)}


async def arrive(streams: Recorder, request_id: str) -> None:
    """A request as a protocol takes it in: counted on its way, the burst wait, then `generate`
    (its outputs are never read: the test ends it once sent)."""
    with streams.admission():
        await streams.wait_for_burst()
        outputs = streams.generate("def f(x):", SamplingParams(max_tokens=1), request_id)
        task = asyncio.ensure_future(anext(outputs))
        while request_id not in streams.adds():
            await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await outputs.aclose()


def test_a_request_alone_at_an_idle_engine_goes_on_without_waiting_out_a_window(monkeypatch):
    """An isolated request (the common case at a low rate) reached the engine 1-2 ms late, every
    time, when it slept a window for a burst that was not coming."""
    monkeypatch.setattr(request_streams, "BURST_WINDOW_S", 0.5)
    streams = Recorder()

    async def main() -> float:
        started = time.monotonic()
        await arrive(streams, "alone")
        return time.monotonic() - started

    assert asyncio.run(main()) < 0.25
    assert streams.adds() == {"alone": False}


def test_what_the_cpus_other_tenant_writes_while_the_first_steps_aside_joins_its_burst(monkeypatch):
    """A client on the server's CPU is preempted as soon as its burst's first request is written; the
    rest arrive only once the server lets it run. The first hands the CPU over (sched_yield) and
    takes in what arrived before it goes on, so that the engine holds its first step for both."""
    streams = Recorder()
    arrivals: list[asyncio.Future[None]] = []

    def client_runs() -> None:  # what the client writes when it gets the CPU: the burst's second request
        if not arrivals:
            arrivals.append(asyncio.ensure_future(arrive(streams, "second")))

    monkeypatch.setattr(os, "sched_yield", client_runs)

    async def main() -> None:
        await arrive(streams, "first")
        await asyncio.gather(*arrivals)

    asyncio.run(main())
    adds = streams.adds()  # the second, taken in while the first stepped aside, may go to the engine first
    assert sorted(adds) == ["first", "second"]
    assert list(adds.values()) == [True, False]  # the engine holds its first step for the other


@pytest.mark.parametrize("busy", [False, True])
def test_a_request_at_a_busy_engine_or_with_others_on_their_way_does_not_step_aside(monkeypatch, busy):
    """Stepping aside is for the first of a burst: a request that finds one in flight joins the next
    step anyway, and one with others on its way says more follow."""
    yields: list[str] = []
    monkeypatch.setattr(os, "sched_yield", lambda: yields.append("yield"))
    streams = Recorder()

    async def main() -> None:
        if busy:
            await arrive(streams, "running")
        else:
            streams._admitting += 1  # another request is on its way
        yields.clear()
        await arrive(streams, "later")

    asyncio.run(main())
    assert yields == []
    assert streams.adds()["later"] is not busy
