"""How a request that reaches an idle engine alone waits for the rest of a burst
(`RequestStreams.wait_for_burst`), driven through a stand-in engine that records the commands; the
sub-millisecond sleep it waits with, and how it reads whether another task is runnable."""

from __future__ import annotations

import asyncio
import os
import select
import time

import pytest

from llm_engine import SamplingParams, cpu_contention, precise_sleep, request_streams
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


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """The lone waits' precise sleeps, recorded (each returns at once)."""
    asked: list[float] = []

    async def record(seconds: float) -> None:
        asked.append(seconds)

    monkeypatch.setattr(precise_sleep, "sleep", record)
    return asked


def contention(monkeypatch, *answers: bool) -> list[bool]:
    """others_runnable answers these in turn; returns the answers not yet given."""
    left = list(answers)
    monkeypatch.setattr(request_streams, "others_runnable", lambda: left.pop(0), raising=False)
    return left


def test_a_request_alone_waits_under_a_millisecond_when_nothing_else_runs_as_its_window_ends(monkeypatch, sleeps):
    """An isolated request (the common case at a low rate) paid the loop's 1 ms timer, 1.1-2 ms,
    every time; with nothing else runnable after a short precise wait, no writer is at work. The
    count is read once, at the short window's end: as the wait starts, the client that just wrote
    is often still runnable (preempted by the server's wake-up; tritonclient's threads at 19 of 24
    isolated gRPC requests), which made every isolated gRPC request wait the long window."""
    left = contention(monkeypatch, False)
    asyncio.run(arrive(Recorder(), "alone"))
    assert sleeps == [request_streams.LONE_WINDOW_S] and left == []
    assert request_streams.LONE_WINDOW_S < 0.001 <= request_streams.LONE_WINDOW_OTHERS_RUNNABLE_S


def test_a_request_alone_waits_the_longer_window_when_another_task_runs_as_its_window_ends(monkeypatch, sleeps):
    """A burst's writer still at work, or waiting for a CPU, writes its next request later: the
    short wait alone split back-to-back bursts under load."""
    left = contention(monkeypatch, True)
    streams = Recorder()
    asyncio.run(arrive(streams, "alone"))
    assert sum(sleeps) == pytest.approx(request_streams.LONE_WINDOW_OTHERS_RUNNABLE_S) and left == []
    assert streams.adds() == {"alone": False}


@pytest.mark.parametrize("busy", [False, True])
def test_a_request_at_a_busy_engine_or_with_others_on_their_way_does_not_wait_alone(monkeypatch, sleeps, busy):
    """The lone wait is for the first of a burst: a request that finds one in flight joins the next
    step anyway, and one with others on its way says more follow."""
    left = contention(monkeypatch, False)  # the first request's, when busy; else never read
    streams = Recorder()

    async def main() -> None:
        if busy:
            await arrive(streams, "running")
        else:
            streams._admitting += 1  # another request is on its way
        sleeps.clear()
        await arrive(streams, "later")

    asyncio.run(main())
    assert sleeps == [] and len(left) == (0 if busy else 1)
    assert streams.adds()["later"] is not busy


def test_what_arrives_while_the_first_waits_alone_joins_its_burst(monkeypatch):
    """The event loop serves on during the wait: a second request that arrives meanwhile is taken in,
    and the engine is told to hold its first step for both."""
    monkeypatch.setattr(request_streams, "LONE_WINDOW_S", 0.2, raising=False)
    monkeypatch.setattr(request_streams, "others_runnable", lambda: False, raising=False)
    streams = Recorder()

    async def main() -> None:
        second = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.02, lambda: second.set_result(asyncio.ensure_future(
            arrive(streams, "second"))))
        await arrive(streams, "first")
        await (await second)

    asyncio.run(main())
    adds = streams.adds()
    assert sorted(adds) == ["first", "second"] and True in adds.values()


def test_the_precise_sleep_sleeps_as_long_as_asked_on_a_timer_the_loop_serves_around():
    async def main() -> tuple[float, bool]:
        served = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(served.set_result, True)
        started = time.monotonic()
        await precise_sleep.sleep(0.03)
        return time.monotonic() - started, served.done()

    slept, served = asyncio.run(main())
    assert 0.03 <= slept < 1.0 and served


@pytest.mark.skipif(not os.path.exists("/proc/self"), reason="timerfd is Linux's")
def test_the_precise_sleeps_timer_is_a_timerfd_armed_for_the_time_asked():
    fd = precise_sleep.timer_fd(0.0003)
    assert fd is not None
    try:
        readable, _, _ = select.select([fd], [], [], 5.0)
        assert readable == [fd] and int.from_bytes(os.read(fd, 8), "little") == 1  # one expiry
    finally:
        os.close(fd)


def test_without_a_timerfd_the_precise_sleep_is_the_loops_own(monkeypatch):
    monkeypatch.setattr(precise_sleep, "timer_fd", lambda seconds: None)

    async def main() -> float:
        started = time.monotonic()
        await precise_sleep.sleep(0.02)
        return time.monotonic() - started

    assert 0.02 <= asyncio.run(main()) < 1.0
    with pytest.raises(ValueError, match="seconds"):
        asyncio.run(precise_sleep.sleep(-1.0))


def _count_from(monkeypatch, path):
    """others_runnable reading `path` in place of /proc/loadavg (its descriptor closed at the end)."""
    kept = cpu_contention.KeptOpenFile(str(path))
    monkeypatch.setattr(cpu_contention, "_LOADAVG", kept)
    return kept


@pytest.mark.parametrize(("runnable", "others"), [(1, False), (2, True), (3, True)])
def test_others_are_runnable_when_the_count_holds_more_than_the_caller(monkeypatch, tmp_path, runnable, others):
    """The count includes the caller; a second runnable task on a machine of 2 CPUs (a burst's one
    busy writer beside the reader) is what the CPU-count rule of stop 31 missed."""
    loadavg = tmp_path / "loadavg"
    loadavg.write_text(f"0.52 0.40 0.77 {runnable}/110 25248\n")
    kept = _count_from(monkeypatch, loadavg)
    assert cpu_contention.others_runnable() is others
    kept.close()


def test_an_unreadable_count_reads_as_others_runnable(monkeypatch, tmp_path):
    """The caller then waits the longer window, the safe side for a burst; a later read tries again."""
    loadavg = tmp_path / "loadavg"
    kept = _count_from(monkeypatch, loadavg)
    assert cpu_contention.others_runnable()  # missing
    loadavg.write_text("not a loadavg\n")
    assert cpu_contention.others_runnable()  # garbled
    loadavg.write_text("0.52 0.40 0.77 1/110 25248\n")
    assert not cpu_contention.others_runnable()
    kept.close()
    assert kept.fd is None
    with pytest.raises(ValueError, match="loadavg"):
        cpu_contention.runnable_tasks("not a loadavg")
    assert cpu_contention.runnable_tasks("0.52 0.40 0.77 3/110 25248") == 3
