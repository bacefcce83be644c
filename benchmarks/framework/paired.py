"""Judging the protocol overhead (issue 21's goal: under 5%) from paired repeats.

Within one repeat of the overhead command the targets run back to back (offline, /v1, /v2, gRPC, the
order rotating per repeat), so a slow spell of the host hits all of them alike, while from one repeat
to the next the host's speed drifts (one target's burst TTFT p50 moved 147-205 ms between repeats of
one run). So each repeat gives one paired ratio per target, its figure over the first target's (the
reference, offline) in that same repeat, and the drift mostly cancels in it.

The ratios' median is judged with the order-statistic interval for a median: for sorted ratios
x(1) <= ... <= x(n), [x(k), x(n+1-k)] holds the ratios' population median with probability
1 - 2 * P(Binomial(n, 1/2) < k), whatever their distribution (only independent repeats are assumed).
It is exact for any n, where a bootstrap of 3-10 repeats is too narrow (its percentiles come from at
most n distinct values and undercover). The interval is two-sided at `level` (90%), so each of its
bounds is a one-sided 95% bound, the one a goal's verdict reads:

- "within 5%" only when the bound on the goal's side is inside it (tok/s: the low end >= 0.95;
  TTFT: the high end <= 1.05),
- "not met" only when the whole interval is outside it,
- "undecided" otherwise, and always when the repeats are too few for the interval to reach `level`
  (3 repeats: [min, max] covers 75%; 5 is the fewest that reach 90%).

Besides the ratio of the phases' TTFT p50s, each repeat gives a per-request one (`ttft_per_request`):
the median over the phase's requests of TTFT_target(i) / TTFT_reference(i), request i paired with
itself (the workload is seeded: every target sends the same requests at the same offsets in every
repeat; `results.per_request` stores them by index), only requests that succeeded on both sides.
It is the figure that answers the goal for TTFT: the overhead a request suffers is its own TTFT
against the same request offline. A p50 of 12 requests jumps with which requests collide in a
step, so the p50s' ratio spread -8%..+35% across the repeats of one quiet run; it is kept beside.

A third TTFT figure (`ttft_protocol`) holds the engine's part equal: the reference's mean TTFT with
the target's time outside the engine in place of its own, over the reference's mean TTFT, i.e.
1 + (outside_target - outside_reference) / TTFT_reference, from each phase's split at the engine's
own timestamps (`runner.ttft_split`). It is the protocol's own cost in TTFT: parsing, tokenizing,
the hand-offs to and from the engine and the first frame. Why it is needed: at 2/s the engine's
part moves with the speed of its steps, which this host changes from one phase to the next with no
CPU wait at all (a quiet run's engine CPU per token 10.6-14.2 ms across phases of one target, and
log TTFT follows it, r 0.92), so the per-request ratio spread ~40-50% across 8 repeats and could
not be judged against 5% in any run, while the time outside the engine varies by tenths of a
millisecond. Conservative for the servers: they tokenize before `generate` (outside), the offline
engine after it (inside). It does not see a protocol that slowed the engine's steps; the tok/s rows
and the engine CPU per token are where that would show.

A repeat where either side's engine waited for a CPU more than `LOADED_WAIT_MS` per output token
(`engine_wait_ms_per_token`, the neighbours' load) is left out of that pair's ratios: a load that
hits one target's turn and not the other's moves the ratio either way (a loaded run of stop 29 read
v1 +20% tok/s "faster" than offline in the repeat where offline's engine waited 7 ms a token). Quiet
runs wait 0.00-0.05 ms a token.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

LEVEL = 0.90
GOAL = 0.05
LOADED_WAIT_MS = 0.5  # ms per output token the engine waited for a CPU: above it a repeat is left out
PER_REQUEST = "ttft_per_request"  # the median of the requests' own TTFT ratios, not a figure of a run
PROTOCOL = "ttft_protocol"  # the reference's TTFT with the target's time outside the engine, over its own
# figure -> True when higher is better (the goal's side of the ratio)
FIGURES = {"output_tokens_per_s": True, "ttft_p50_ms": False, PER_REQUEST: False, PROTOCOL: False}
LABELS = {"output_tokens_per_s": "tok/s", "ttft_p50_ms": "TTFT p50", PER_REQUEST: "TTFT/req", PROTOCOL: "TTFT prot"}


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    confidence: float  # the probability that [low, high] holds the median (exact, distribution-free)


@dataclass(frozen=True)
class Judged:
    phase: str
    target: str
    figure: str
    ratios: tuple[float, ...]  # per repeat: the target's figure / the reference's, same repeat
    median: float
    interval: Interval
    verdict: str  # "within 5%", "not met", "undecided"


def coverage(n: int, k: int) -> float:
    """The probability that [x(k), x(n+1-k)] of n sorted independent values holds their median."""
    if not 1 <= k <= (n + 1) // 2:
        raise ValueError(f"order statistic {k} of {n} does not bound an interval")
    return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / float(2 ** n)


def median_interval(values: list[float], level: float = LEVEL) -> Interval:
    """The narrowest order-statistic interval for the median that reaches `level`; with too few
    values, [min, max] and its own (lower) confidence."""
    if not values:
        raise ValueError("no values to bound")
    if not 0 < level < 1:
        raise ValueError(f"level must be between 0 and 1, not {level}")
    ordered = sorted(values)
    n = len(ordered)
    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(n, k + 1) >= level:
        k += 1
    return Interval(ordered[k - 1], ordered[n - k], coverage(n, k))


def bound_verdict(interval: Interval, bound: float, higher_is_better: bool, level: float = LEVEL) -> str:
    """"met" when the interval's bound on the goal's side is past `bound` (higher_is_better: its low
    end at least `bound`; else its high end at most `bound`), "not met" when the whole interval is on
    the wrong side, "undecided" otherwise or when its confidence is under `level`."""
    if interval.confidence < level:
        return "undecided"
    if higher_is_better:
        met, missed = interval.low >= bound, interval.high < bound
    else:
        met, missed = interval.high <= bound, interval.low > bound
    return "met" if met else "not met" if missed else "undecided"


def verdict(interval: Interval, higher_is_better: bool, goal: float = GOAL, level: float = LEVEL) -> str:
    """The goal's verdict on a ratio's interval: the ratio may be at most `goal` worse than 1."""
    said = bound_verdict(interval, 1 - goal if higher_is_better else 1 + goal, higher_is_better, level)
    return f"within {goal:.0%}" if said == "met" else said


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or math.isnan(a) or math.isnan(b) or b <= 0:
        return None
    return a / b


def request_ratio(reference: dict[str, Any], run: dict[str, Any]) -> float | None:
    """The median over requests of the run's TTFT over the same request's (same index) in the
    reference run; requests failed on either side are left out; None when no request pairs."""
    theirs = {r["index"]: r.get("ttft_ms") for r in reference.get("requests", ())}
    ratios = [ratio for r in run.get("requests", ()) if r["index"] in theirs
              and (ratio := _ratio(r.get("ttft_ms"), theirs[r["index"]])) is not None]
    return statistics.median(ratios) if ratios else None


def protocol_ratio(reference: dict[str, Any], run: dict[str, Any]) -> float | None:
    """The reference's mean TTFT with the run's time outside the engine instead of its own, over
    the reference's mean TTFT; None when either phase lacks the split (an engine that did not count
    every request)."""
    mean, ours, theirs = (reference.get("ttft_mean_ms"), reference.get("ttft_outside_engine_ms"),
                          run.get("ttft_outside_engine_ms"))
    if mean is None or ours is None or theirs is None:
        return None
    return _ratio(mean - ours + theirs, mean)


def paired_ratios(reference: list[dict[str, Any]], runs: list[dict[str, Any]], figure: str,
                  loaded_wait_ms: float = LOADED_WAIT_MS) -> list[float]:
    """Repeat r's figure over the reference's in repeat r (`PER_REQUEST`: its requests' median
    ratio; `PROTOCOL`: `protocol_ratio`); repeats where either is missing, or either's engine waited
    more than `loaded_wait_ms` per token for a CPU, are left out."""
    ratios = []
    for ref, run in zip(reference, runs):
        if max(run.get("engine_wait_ms_per_token", 0.0), ref.get("engine_wait_ms_per_token", 0.0)) > loaded_wait_ms:
            continue
        ratio = (request_ratio(ref, run) if figure == PER_REQUEST else protocol_ratio(ref, run) if figure == PROTOCOL
                 else _ratio(run.get(figure), ref.get(figure)))
        if ratio is not None:
            ratios.append(ratio)
    return ratios


def judge(result: dict[str, Any], goal: float = GOAL, level: float = LEVEL,
          loaded_wait_ms: float = LOADED_WAIT_MS) -> list[Judged]:
    """Every (phase, target) but the reference (the first target of each phase), per goal figure; a
    pair with no quiet repeat at all is listed with no ratios, undecided. The per-request figure is
    left out where neither side stored its requests (a result from before they were stored), the
    protocol figure where neither side has the TTFT split (no engine counted every request)."""
    by_phase: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for key, entry in result["figures"].items():
        target, phase = key.split(" / ", 1)
        by_phase.setdefault(phase, {})[target] = entry["runs"]
    judged = []
    for phase, targets in by_phase.items():
        reference = next(iter(targets.values()))
        for target, runs in list(targets.items())[1:]:
            for figure, higher in FIGURES.items():
                if figure == PER_REQUEST and not any("requests" in r for r in (*reference, *runs)):
                    continue
                if figure == PROTOCOL and not any("ttft_outside_engine_ms" in r for r in (*reference, *runs)):
                    continue
                ratios = paired_ratios(reference, runs, figure, loaded_wait_ms)
                if not ratios:
                    judged.append(Judged(phase, target, figure, (), math.nan, Interval(math.nan, math.nan, 0.0),
                                         "undecided"))
                    continue
                interval = median_interval(ratios, level)
                judged.append(Judged(phase, target, figure, tuple(ratios), statistics.median(ratios), interval,
                                     verdict(interval, higher, goal, level)))
    return judged


def table(judged: list[Judged], reference: str, loaded_wait_ms: float = LOADED_WAIT_MS) -> str:
    """One line per (phase, target, figure): the paired ratios, their median, interval, verdict and
    spread (the per-repeat ratios' max - min, in points: what more repeats or requests must narrow)."""
    lines = [f"paired with {reference} in each repeat (order-statistic interval for the median; repeats where "
             f"an engine waited > {loaded_wait_ms:g} ms/token for a CPU left out; TTFT/req: the median of the "
             f"requests' own TTFT ratios; TTFT prot: {reference}'s mean TTFT with the target's time outside "
             f"the engine):",
             f"{'phase':<16} {'target':<8} {'figure':<9} {'median':>8} {'interval':>17} {'conf':>5}  "
             f"{'verdict':<10} {'spread':>6}  per repeat"]
    for j in judged:
        if not j.ratios:
            lines.append(f"{j.phase:<16} {j.target:<8} {LABELS[j.figure]:<9} {'':>8} {'':>17} {'':>5}  "
                         f"{j.verdict:<10} {'':>6}  (no quiet repeat)")
            continue
        lines.append(f"{j.phase:<16} {j.target:<8} {LABELS[j.figure]:<9} {j.median - 1:>+8.1%} "
                     f"[{j.interval.low - 1:>+6.1%}, {j.interval.high - 1:>+6.1%}] {j.interval.confidence:>5.0%}  "
                     f"{j.verdict:<10} {max(j.ratios) - min(j.ratios):>6.1%}  "
                     f"{', '.join(f'{r - 1:+.1%}' for r in j.ratios)}")
    return "\n".join(lines)


def as_json(judged: list[Judged]) -> list[dict[str, Any]]:
    return [{"phase": j.phase, "target": j.target, "figure": j.figure, "ratios": [round(r, 4) for r in j.ratios],
             "median": round(j.median, 4), "low": round(j.interval.low, 4), "high": round(j.interval.high, 4),
             "confidence": round(j.interval.confidence, 4), "verdict": j.verdict} for j in judged]
