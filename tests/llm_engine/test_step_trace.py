"""The engine loop's per-step trace (CODEYARD_STEP_TRACE): one line a step, nothing when unset."""

from __future__ import annotations

import os
from pathlib import Path

from llm_engine import step_trace
from llm_engine.engine_loop import NO_COMMAND, AddRequest, run_loop
from llm_engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from llm_engine.sampling_params import SamplingParams


class FakeEngine:
    """Runs `steps` steps; the first one gives one request its first token, the rest a second."""

    def __init__(self, steps: int) -> None:
        self.total = self.left = steps
        self.last_iteration_tokens = 0
        self.requests: dict[str, object] = {}

    def has_unfinished_requests(self) -> bool:
        return self.left > 0

    def release_kv_holds(self) -> int:
        return 0

    def add_request(self, *args: object, **kwargs: object) -> None:
        pass

    def step(self) -> list[RequestOutput]:
        tokens = [1] if self.left == self.total else [1, 2]
        self.left -= 1
        self.last_iteration_tokens = 7
        return [RequestOutput("r", None, [1, 2, 3], [CompletionOutput(0, "", tokens, None, None)],
                              finished=self.left == 0, metrics=RequestMetrics(arrival_time=0.0))]


class Host:
    """Adds one request, then stops the loop once the engine has run out of steps."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        self.commands: list[object] = [AddRequest("r", [1, 2, 3], SamplingParams(max_tokens=2), 0, 0.0)]
        self.steps = 0

    def next_command(self, wait: float) -> object:
        if self.commands:
            return self.commands.pop(0)
        return None if not self.engine.left else NO_COMMAND

    def added(self, engine: object) -> None:
        pass

    def report(self, engine: object, outputs: list[RequestOutput]) -> None:
        self.steps += 1

    def idle(self, engine: object) -> None:
        pass


def run(engine: FakeEngine) -> None:
    run_loop(engine, Host(engine))  # type: ignore[arg-type]


def test_each_step_is_a_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(step_trace.ENV, str(tmp_path / "trace"))
    run(FakeEngine(3))
    steps = step_trace.read(tmp_path / "trace" / f"steps-{os.getpid()}.jsonl")
    assert len(steps) == 3
    assert [s["tokens"] for s in steps] == [7, 7, 7]
    assert [s["firsts"] for s in steps] == [1, 0, 0]
    assert steps[0]["gap"] is None and all(s["gap"] >= 0 for s in steps[1:])
    assert all(s["wall"] >= 0 and s["cpu"] >= 0 and s["gc"] >= 0 for s in steps)
    assert steps[0]["t"] <= steps[1]["t"] <= steps[2]["t"]


def test_unset_writes_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(step_trace.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    run(FakeEngine(2))
    assert not list(tmp_path.rglob("steps-*.jsonl"))
