"""benchmarks/overhead_aa.py: the A/A run pairs a target with itself the way the overhead verdict
pairs offline with a server, so its figures' spread is their own noise."""

from __future__ import annotations

import asyncio
import math

import pytest

from benchmarks.framework import paired
from benchmarks.framework.targets import Sample
from benchmarks.framework.workloads import Item, Phase
from benchmarks.overhead_aa import log_sd, main, measure


class _Stub:
    """Answers each prompt ("p <ms>") with that TTFT, and records the calls."""

    name = "stub"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def send(self, item: Item) -> Sample:
        self.calls.append(item.prompt)
        ttft = int(item.prompt.split()[1]) / 1000
        return Sample(True, 0.0, ttft, ttft + 0.01, 3)

    def cpu(self):
        return None

    def engine_ttft(self):
        return None

    def probe(self):
        return 0, 0.0


def _phases() -> dict[int, Phase]:
    return {n: Phase(f"x{n}", [Item(f"p {10 + 7 * i}", 3) for i in range(n)]) for n in (3, 5)}


def test_each_repeat_pairs_a_run_with_itself_in_the_frameworks_form():
    target = _Stub()
    result = asyncio.run(measure(target, _phases(), 4, log=lambda *_: None))
    assert list(result["figures"]) == ["A / 2/s x3", "B / 2/s x3", "A / 2/s x5", "B / 2/s x5"]
    assert all(len(entry["runs"]) == 4 for entry in result["figures"].values())
    run = result["figures"]["B / 2/s x5"]["runs"][2]
    assert [r["index"] for r in run["requests"]] == list(range(5)) and run["requests"][1]["ttft_ms"] == 17.0
    # warm-up (5 prompts), then each repeat: sizes and sides in alternating order
    assert len(target.calls) == 5 + 4 * 2 * (3 + 5)
    judged = paired.judge(result)
    ttft = [j for j in judged if j.figure != "output_tokens_per_s"]
    assert {(j.phase, j.figure) for j in ttft} == {(p, f) for p in ("2/s x3", "2/s x5")
                                                   for f in ("ttft_p50_ms", "ttft_per_request")}
    assert all(j.ratios == pytest.approx([1.0] * 4) for j in ttft)
    assert all("SD of log ratio 0.0% over 4 repeats" in line for line in log_sd(ttft))


def test_the_spread_is_the_sd_of_the_log_ratios():
    judged = paired.Judged("2/s x12", "B", "ttft_per_request", (1.1, 1 / 1.1), 1.0,
                           paired.Interval(1 / 1.1, 1.1, 0.5), "undecided")
    [line] = log_sd([judged])
    assert f"{math.sqrt(2) * math.log(1.1):.1%}" in line  # two values +-log 1.1: SD sqrt(2) log 1.1
    one = paired.Judged("2/s x12", "B", "ttft_p50_ms", (1.1,), 1.1, paired.Interval(1.1, 1.1, 0.0), "undecided")
    assert "nan" in log_sd([one])[0]


def test_bad_options_are_refused_before_any_engine_starts(capsys):
    with pytest.raises(SystemExit):
        main(["--repeats", "1"])
    assert "at least 2" in capsys.readouterr().err
