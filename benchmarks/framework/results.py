"""Figures of a run, the JSON they are stored in, and the noise-aware comparison with a baseline.

A result holds every repeat of every (target, phase), so a comparison sees the spread and not just
one number. The rule: a figure regressed only when the current repeats are worse than the
baseline's with a two-sided Mann-Whitney U test at p < alpha (a rank test: no normality assumed,
robust to one outlier repeat) AND the medians differ by more than `min_change` in the bad
direction. Both are needed: significance alone flags tiny real shifts over many repeats, and a
big difference alone flags noise over few. With 4+ repeats on each side the exact test can reach
p < 0.05; fewer can never flag anything, which the table says.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks._workload import percentile
from benchmarks.framework.targets import Sample

REPO = Path(__file__).resolve().parents[2]

# figure -> True when higher is better; what `compare` checks by default
DIRECTIONS = {"output_tokens_per_s": True, "request_throughput": True, "goodput": True,
              "ttft_p50_ms": False, "ttft_p99_ms": False, "tpot_p50_ms": False, "itl_p50_ms": False,
              "e2e_p50_ms": False, "throughput_ratio": True, "ttft_ratio": False,
              "engine_cpu_ms_per_token": False, "serving_cpu_ms_per_token": False}


def summarize(samples: list[Sample], duration: float, ttft_slo_ms: float, tpot_slo_ms: float) -> dict:
    """Throughput over the phase's wall time; latency percentiles over requests; goodput: requests
    per second that met both SLOs (TTFT and time per output token)."""
    ok = [s for s in samples if s.ok]
    ttft = [(s.first - s.start) * 1000 for s in ok]
    tpot = [(s.finish - s.first) * 1000 / (s.tokens - 1) for s in ok if s.tokens > 1]
    itl = [g * 1000 for s in ok for g in s.gaps]
    e2e = [(s.finish - s.start) * 1000 for s in ok]
    good = sum(1 for s in ok if (s.first - s.start) * 1000 <= ttft_slo_ms
               and (s.tokens < 2 or (s.finish - s.first) * 1000 / (s.tokens - 1) <= tpot_slo_ms))

    def pct(values: list[float], q: float) -> float:
        return round(percentile(values, q), 2) if values else math.nan

    out = {"completed": len(ok), "failed": len(samples) - len(ok), "duration_s": round(duration, 3),
           "request_throughput": round(len(ok) / duration, 3),
           "output_tokens_per_s": round(sum(s.tokens for s in ok) / duration, 2),
           "goodput": round(good / duration, 3)}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        for q in (50, 90, 99):
            out[f"{name}_p{q}_ms"] = pct(values, q)
    return out


def per_request(samples: list[Sample]) -> list[dict]:
    """Each request as its client saw it, by its index in the phase (the order its waves send them,
    the same for every target: the workload is seeded), so later analyses pair a request with itself
    on another target without a rerun. A failed request keeps its index and its error."""
    rows: list[dict] = []
    for index, s in enumerate(samples):
        if s.ok:
            rows.append({"index": index, "ttft_ms": round((s.first - s.start) * 1000, 3),
                         "e2e_ms": round((s.finish - s.start) * 1000, 3), "tokens": s.tokens})
        else:
            rows.append({"index": index, "error": s.error or "failed"})
    return rows


# ----- the stored result ------------------------------------------------------------------------------

def git_state() -> dict:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return {"commit": git("rev-parse", "HEAD"), "subject": git("log", "-1", "--format=%s")[:120],
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def machine_fingerprint() -> dict:
    """What makes figures from two machines incomparable; `id` hashes the stable parts."""
    import torch

    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    stable = {"cpu": cpu, "cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
              "torch": torch.__version__, "threads": torch.get_num_threads()}
    digest = hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()[:12]
    return {**stable, "id": digest, "load_average": round(os.getloadavg()[0], 2)}


def new_result(kind: str, name: str, settings: dict) -> dict:
    return {"schema": 1, "kind": kind, "name": name, "settings": settings, "created": time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "git": git_state(), "machine": machine_fingerprint(), "figures": {}}


def add_repeat(result: dict, key: str, figures: dict, x: float | None = None) -> None:
    """Append one repeat's figures under `key` (e.g. "v2 / 4/s")."""
    entry = result["figures"].setdefault(key, {"x": x, "runs": []})
    entry["runs"].append(figures)


def save(result: dict, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=1, allow_nan=True) + "\n")


def load(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


# ----- comparison ----------------------------------------------------------------------------------------

def mann_whitney_p(a: list[float], b: list[float]) -> float:
    """Two-sided p of the Mann-Whitney U test: exact (all splits of the pooled ranks) when there
    are at most 200k of them, else the normal approximation with tie correction."""
    n, m = len(a), len(b)
    if not n or not m:
        return 1.0
    pooled = sorted((v, i) for i, v in enumerate(a + b))
    ranks = [0.0] * (n + m)
    i = 0
    while i < len(pooled):  # mid-ranks for ties
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[pooled[k][1]] = (i + j) / 2 + 1
        i = j + 1
    observed = sum(ranks[:n])
    mean = n * (n + m + 1) / 2
    if math.comb(n + m, n) <= 200_000:
        deviation = abs(observed - mean) - 1e-9
        extreme = sum(1 for combo in itertools.combinations(ranks, n) if abs(sum(combo) - mean) >= deviation)
        return extreme / math.comb(n + m, n)
    ties = sum(c ** 3 - c for c in (list(ranks).count(r) for r in set(ranks)))
    var = n * m / 12 * ((n + m + 1) - ties / ((n + m) * (n + m - 1)))
    z = (abs(observed - mean) - 0.5) / math.sqrt(var) if var else 0.0
    return math.erfc(z / math.sqrt(2))


@dataclass
class Verdict:
    key: str
    figure: str
    baseline: float
    current: float
    change: float  # current / baseline - 1
    p: float
    status: str  # "regression", "improvement", "same", "noisy" (too few repeats to tell)


def compare_figure(key: str, figure: str, base: list[float], cur: list[float], alpha: float,
                   min_change: float, higher_is_better: bool | None = None) -> Verdict:
    if higher_is_better is None:
        higher_is_better = DIRECTIONS[figure]
    b, c = statistics.median(base), statistics.median(cur)
    change = c / b - 1 if b else 0.0
    p = mann_whitney_p(base, cur)
    worse = -change if higher_is_better else change
    if min(len(base), len(cur)) < 4 and abs(change) > min_change:
        status = "noisy"
    elif p < alpha and worse > min_change:
        status = "regression"
    elif p < alpha and -worse > min_change:
        status = "improvement"
    else:
        status = "same"
    return Verdict(key, figure, b, c, change, p, status)


def compare(baseline: dict, current: dict, figures: list[str] | None = None, alpha: float = 0.05,
            min_change: float = 0.05) -> list[Verdict]:
    directions = {**DIRECTIONS, **current.get("directions", {})}  # a suite names its own figures' directions
    verdicts = []
    for key, entry in current["figures"].items():
        if key not in baseline["figures"]:
            continue
        base_runs, cur_runs = baseline["figures"][key]["runs"], entry["runs"]
        for figure in figures or [f for f in directions if f in cur_runs[0]]:
            base = [r[figure] for r in base_runs if figure in r and r[figure] is not None and not math.isnan(r[figure])]
            cur = [r[figure] for r in cur_runs if figure in r and r[figure] is not None and not math.isnan(r[figure])]
            if base and cur and figure in directions:
                verdicts.append(compare_figure(key, figure, base, cur, alpha, min_change, directions[figure]))
    return verdicts


def table(verdicts: list[Verdict], baseline: dict, current: dict) -> str:
    lines = [f"baseline {baseline['git']['commit'][:10]} ({baseline['created']}, machine {baseline['machine']['id']}) "
             f"vs current {current['git']['commit'][:10]}{' +dirty' if current['git']['dirty'] else ''} "
             f"({current['created']}, machine {current['machine']['id']})"]
    if baseline["machine"]["id"] != current["machine"]["id"]:
        lines.append("warning: different machines; only ratio figures are comparable")
    lines.append(f"{'what':<28} {'figure':<20} {'baseline':>10} {'current':>10} {'change':>8} {'p':>7}  verdict")
    for v in verdicts:
        lines.append(f"{v.key:<28} {v.figure:<20} {v.baseline:>10.3f} {v.current:>10.3f} {v.change:>+8.1%} "
                     f"{v.p:>7.4f}  {v.status.upper() if v.status == 'regression' else v.status}")
    return "\n".join(lines)
