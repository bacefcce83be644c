"""llm_disagg's statistics: the pooled p99 ratio, its block bootstrap interval, the verdict, and the
break-down of a request's decoding span into the traced steps."""

from __future__ import annotations

import argparse
import re

import numpy
import pytest

from benchmarks.llm_disagg import budgets
from benchmarks.llm_disagg_analysis import (
    Span,
    block_bootstrap_ratio,
    cpu_per_token,
    span_line,
    spread,
    steps_line,
    verdict,
)


def test_pooled_ratio_is_the_p99s_ratio_and_the_interval_holds_it() -> None:
    rng = numpy.random.default_rng(0)
    slow = {(r, b): list(rng.uniform(0.02, 0.03, 10)) + ([0.2] if b == 0 else []) for r in range(3) for b in range(3)}
    fast = {(r, b): list(rng.uniform(0.02, 0.03, 10)) for r in range(3) for b in range(3)}
    ratio = block_bootstrap_ratio(slow, fast, 99, 300)
    expected = numpy.percentile(sum(slow.values(), []), 99) / numpy.percentile(sum(fast.values(), []), 99)
    assert ratio.median == pytest.approx(expected)
    assert ratio.low <= ratio.median <= ratio.high
    assert ratio.high > ratio.low  # blocks differ: the resamples do too


def test_the_bootstrap_resamples_blocks_not_requests() -> None:
    """One block holds every slow request: a resample either has them or not, so the interval spans
    from about 1x to the pooled ratio; resampling requests one by one would keep some in nearly every draw."""
    slow = {0: [1.0] * 10, **{b: [0.01] * 10 for b in range(1, 10)}}
    fast = {b: [0.01] * 10 for b in range(10)}
    ratio = block_bootstrap_ratio(slow, fast, 99, 400)
    assert ratio.low == pytest.approx(1.0)
    assert ratio.high == pytest.approx(ratio.median)


def test_verdict() -> None:
    assert verdict(spread([2.1, 2.5, 3.0]), 2.0) == "met"
    assert verdict(spread([1.0, 1.5, 1.9]), 2.0) == "not met"
    assert verdict(spread([1.5, 2.2, 3.0]), 2.0).startswith("undecided")


def test_a_span_counts_the_steps_that_ended_inside_it() -> None:
    steps = [{"t": t, "wall": 0.01, "cpu": 0.008, "tokens": 4, "firsts": int(t == 1.02), "gc": 0.0, "gap": 0.001}
             for t in (0.9, 1.0, 1.02, 1.04, 1.2)]
    line = span_line(Span(1.0, 1.06, 4), steps)
    assert "over 3 steps" in line and "1 steps with joins" in line and "20.0 ms a token" in line
    assert "3 steps where" not in steps_line(steps) and steps_line(steps).startswith("5 steps")
    # a step that began before the span counts only its part inside: the time between steps stays >= 0
    long_first = [{**steps[0], "t": 0.9, "wall": 0.11}, {**steps[0], "t": 1.01, "wall": 0.01}]
    gaps = re.search(r"between steps (-?\d+) ms", span_line(Span(1.0, 1.02, 2), long_first))
    assert gaps is not None and int(gaps.group(1)) >= 0


def test_cpu_a_token_counts_only_the_steps_that_gave_the_request_its_tokens() -> None:
    """Steps of 8 ms CPU that waited 40 ms for a core: the TPOT is the wall's, this the CPU's."""
    steps = [{"t": 1.0 + 0.05 * n, "wall": 0.048, "cpu": 0.008, "tokens": 2, "firsts": 0, "gc": 0.0, "gap": 0.002}
             for n in range(-2, 6)]
    span = Span(1.049, 1.049 + 4 * 0.05, 5)  # its tokens 1 ms after the steps at 1.0 (its first) to 1.2 ended
    assert cpu_per_token(span, steps) == pytest.approx(0.008)
    assert cpu_per_token(Span(5.0, 6.0, 3), steps) is None  # no traced steps inside
    assert cpu_per_token(Span(1.048, 1.048, 1), steps) is None  # one token: no TPOT


def test_budgets_are_a_positive_list() -> None:
    assert budgets("256,512") == [256, 512]
    for bad in ("x", "0", "512,-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            budgets(bad)
