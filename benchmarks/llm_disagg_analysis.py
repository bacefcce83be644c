"""The statistics of `llm_disagg.py`: TPOT p99 ratios with their spread, and what the decoding
engine's steps contained while the slowest short requests decoded.

A short request's TPOT p99 rests on the few requests a burst of long prompts catches while they
decode, so one run's ratio swings with how many the seeded schedule puts there. The benchmark
therefore runs several rounds (a new seed each, setups alternated) and pools them; the ratio's
spread comes from a paired block bootstrap: the blocks are (round, burst period), since requests in
one burst period share its stall and are not independent, and each resample takes the same blocks
for both setups (they served the same schedules).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy


def percentile(values: Sequence[float], q: float) -> float:
    """numpy's (linear between the two nearest ranks), as vLLM's benchmark reports percentiles."""
    return float(numpy.percentile(values, q)) if len(values) else float("nan")


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float

    def text(self, unit: str = "", digits: int = 1) -> str:
        return f"{self.median:.{digits}f}{unit} ({self.low:.{digits}f}-{self.high:.{digits}f})"


def spread(values: Sequence[float]) -> Spread:
    """Median and range of per-round figures."""
    return Spread(statistics.median(values), min(values), max(values)) if values else Spread(*[float("nan")] * 3)


def block_bootstrap_ratio(numerator: dict[Any, list[float]], denominator: dict[Any, list[float]], q: float,
                          draws: int, seed: int = 0) -> Spread:
    """The ratio of the q-th percentiles of two setups' values, pooled over blocks (dict key: block),
    and its 5th-95th percentile interval over `draws` paired resamples of the blocks."""
    blocks = sorted(set(numerator) | set(denominator), key=str)
    pooled = percentile([v for b in blocks for v in numerator.get(b, [])], q) / percentile(
        [v for b in blocks for v in denominator.get(b, [])], q)
    rng = random.Random(seed)
    ratios = []
    for _ in range(draws):
        chosen = [rng.choice(blocks) for _ in blocks]
        top = [v for b in chosen for v in numerator.get(b, [])]
        bottom = [v for b in chosen for v in denominator.get(b, [])]
        if top and bottom:
            ratios.append(percentile(top, q) / percentile(bottom, q))
    return Spread(pooled, percentile(ratios, 5), percentile(ratios, 95))


def verdict(ratio: Spread, goal: float) -> str:
    if ratio.low >= goal:
        return "met"
    if ratio.high < goal:
        return "not met"
    return "undecided (the interval straddles the goal)"


@dataclass(frozen=True)
class Span:
    """A request's decoding, first to last token, in time.time() seconds."""

    first: float
    last: float
    tokens: int


def steps_line(steps: list[dict[str, Any]]) -> str:
    """The engine's steps in a schedule: wall and CPU per step, its wait (wall - CPU), the
    collector's share, the gaps between steps, and the steps in which requests joined."""
    if not steps:
        return "no steps traced"
    wall = [s["wall"] for s in steps]
    cpu = [s["cpu"] for s in steps]
    waited = [s["wall"] - s["cpu"] for s in steps]
    gaps = [s["gap"] for s in steps if s["gap"] is not None]
    joins = [s["wall"] for s in steps if s["firsts"]]
    plain = [s["wall"] for s in steps if not s["firsts"]]
    return (f"{len(steps)} steps: wall p50 {1000 * percentile(wall, 50):.1f} / p99 {1000 * percentile(wall, 99):.1f} / "
            f"max {1000 * max(wall):.1f} ms, thread CPU p50 {1000 * percentile(cpu, 50):.1f} / p99 "
            f"{1000 * percentile(cpu, 99):.1f} ms, waiting for a core p99 {1000 * percentile(waited, 99):.1f} ms "
            f"({sum(waited):.1f} s in all); GC {1000 * sum(s['gc'] for s in steps):.0f} ms in all, max "
            f"{1000 * max(s['gc'] for s in steps):.1f} ms a step; between steps p50 {1000 * percentile(gaps, 50):.2f} / "
            f"p99 {1000 * percentile(gaps, 99):.2f} ms; steps where requests got a first token: {len(joins)}, wall "
            f"p50 {1000 * percentile(joins, 50):.1f} ms against {1000 * percentile(plain, 50):.1f} without")


def steps_inside(span: Span, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps that ended inside a request's decoding span: those that gave it its tokens after the first."""
    return [s for s in steps if span.first <= s["t"] + s["wall"] <= span.last]


def cpu_per_token(span: Span, steps: list[dict[str, Any]]) -> float | None:
    """The engine thread's CPU seconds in the steps that gave a request its tokens after the first,
    per token: its TPOT had the engine never waited for a core nor idled between steps. Other load
    on the machine raises a TPOT (the wait) far more than this, so an A/B under load compares it."""
    inside = steps_inside(span, steps)
    return sum(s["cpu"] for s in inside) / (span.tokens - 1) if inside and span.tokens > 1 else None


def span_line(span: Span, steps: list[dict[str, Any]]) -> str:
    """Where one request's decoding time went: the steps inside its span (their wall, CPU, tokens a
    step, joins, collector), and the time between them (the engine loop's own work or idling)."""
    inside = steps_inside(span, steps)
    if not inside:
        return "no traced steps inside"
    # the first step may have begun before the span: only its part inside counts against the gaps
    wall = sum(s["t"] + s["wall"] - max(s["t"], span.first) for s in inside)
    cpu = sum(s["cpu"] for s in inside)
    slowest = max(inside, key=lambda s: s["wall"])
    length = span.last - span.first
    return (f"{length / max(span.tokens - 1, 1) * 1000:.1f} ms a token over {len(inside)} steps ({1000 * length:.0f} ms): "
            f"steps' wall inside it {1000 * wall:.0f} ms (their CPU {1000 * cpu:.0f}), between "
            f"steps {1000 * (length - wall):.0f} ms; tokens a step median "
            f"{statistics.median(s['tokens'] for s in inside):.0f}, max {max(s['tokens'] for s in inside)}; "
            f"{sum(1 for s in inside if s['firsts'])} steps with joins; GC {1000 * sum(s['gc'] for s in inside):.0f} ms; "
            f"slowest step {1000 * slowest['wall']:.0f} ms ({slowest['tokens']} tokens, CPU "
            f"{1000 * slowest['cpu']:.0f} ms)")
