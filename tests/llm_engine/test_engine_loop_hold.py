"""An idle engine's hold for a burst (`AddRequest.more`): it lasts while requests keep saying more
are behind them, each one extending it by ADMISSION_HOLD_S, and ADMISSION_HOLD_MAX_S in all.
Run on a virtual clock: the host moves it forward when the loop waits."""

from __future__ import annotations

import pytest

from llm_engine import engine_loop
from llm_engine.engine_loop import ADMISSION_HOLD_MAX_S, ADMISSION_HOLD_S, NO_COMMAND, AddRequest, run_loop
from llm_engine.outputs import RequestOutput
from llm_engine.sampling_params import SamplingParams


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


class Engine:
    """Every step takes in what was added since the last one and finishes it."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.waiting, self.steps = clock, [], []
        self.requests: dict[str, object] = {}
        self.last_iteration_tokens = 0

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting)

    def release_kv_holds(self) -> int:
        return 0

    def add_request(self, request_id: str, *args: object, **kwargs: object) -> None:
        self.waiting.append(request_id)

    def step(self) -> list[RequestOutput]:
        self.steps.append((self.clock.now, list(self.waiting)))
        self.waiting.clear()
        return []


class Host:
    """Delivers each request at its arrival time (seconds after the first); stops once all are stepped."""

    def __init__(self, clock: Clock, engine: Engine, arrivals: list[float]) -> None:
        self.clock, self.engine = clock, engine
        start = clock.now
        self.script = [(start + at, AddRequest(f"r{i}", [1, 2], SamplingParams(max_tokens=1), 0, 0.0,
                                               more=i < len(arrivals) - 1))
                       for i, at in enumerate(arrivals)]

    def next_command(self, wait: float) -> object:
        if not self.script:
            return None if not self.engine.waiting else NO_COMMAND
        at, command = self.script[0]
        if at <= self.clock.now + wait:
            self.clock.now = max(self.clock.now, at)
            self.script.pop(0)
            return command
        self.clock.now += wait
        return NO_COMMAND

    def added(self, engine: object) -> None:
        pass

    def report(self, engine: object, outputs: list[RequestOutput]) -> None:
        pass

    def idle(self, engine: object) -> None:
        pass


def steps_for(arrivals: list[float], monkeypatch) -> list[tuple[float, list[str]]]:
    clock = Clock()
    monkeypatch.setattr(engine_loop.time, "monotonic", clock.monotonic)
    start = clock.now
    engine = Engine(clock)
    run_loop(engine, Host(clock, engine, arrivals))  # type: ignore[arg-type]
    return [(round(at - start, 4), ids) for at, ids in engine.steps]


def test_a_burst_coming_in_slower_than_the_hold_still_starts_in_one_step(monkeypatch):
    """12 requests 7 ms apart (77 ms in all, past ADMISSION_HOLD_S from the first): one step."""
    gap = 0.007
    assert 11 * gap > ADMISSION_HOLD_S and 11 * gap < ADMISSION_HOLD_MAX_S
    steps = steps_for([i * gap for i in range(12)], monkeypatch)
    assert [len(ids) for _, ids in steps] == [12]
    assert steps[0][0] == pytest.approx(11 * gap)  # stepped as the last one (more=False) came in


def test_a_request_saying_more_with_nothing_behind_it_holds_the_engine_for_the_hold_only(monkeypatch):
    steps = steps_for([0.0, 0.005, 0.2], monkeypatch)  # the 2nd says more; the 3rd comes far too late
    assert [ids for _, ids in steps] == [["r0", "r1"], ["r2"]]
    assert steps[0][0] == pytest.approx(0.005 + ADMISSION_HOLD_S, abs=0.002)


def test_a_trickle_that_never_ends_is_stepped_after_the_longest_hold(monkeypatch):
    steps = steps_for([i * 0.01 for i in range(40)], monkeypatch)  # 10 ms apart for 0.4 s, all saying more
    assert steps[0][0] <= ADMISSION_HOLD_MAX_S + 0.011
    assert len(steps[0][1]) == pytest.approx(ADMISSION_HOLD_MAX_S / 0.01, abs=1.5)
