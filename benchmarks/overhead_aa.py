"""The overhead verdict's TTFT figures against themselves: an A/A run (issue 21).

The offline target runs the overhead workload's 2/s phase twice per repeat, "A" and "B" (the same
engine, back to back, the order alternating), at each `--num-requests` (alternated), and the two
are paired exactly as `python -m benchmarks run ... --targets` pairs offline with a server: per
repeat the TTFT p50 ratio and the per-request figure (`paired.request_ratio`). The true ratio is 1,
so each figure's spread over the repeats is its own noise, the one a verdict has to see through,
measured in one run on one load:

    python benchmarks/overhead_aa.py --repeats 8 --num-requests 12,24 --out aa.json

It prints `paired.table` (median, order-statistic interval, verdict, spread) and each figure's
per-repeat SD of the log ratio; `--out` writes a result that `python -m benchmarks paired` reads.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.framework import paired, results, runner  # noqa: E402

SIDES = ("A", "B")


def log_sd(judged: list[paired.Judged]) -> list[str]:
    """Per (phase, figure): the SD over repeats of the log of the paired ratio (nan below 2 repeats)."""
    return [f"{j.phase:<10} {paired.LABELS[j.figure]:<9} SD of log ratio "
            f"{statistics.stdev(math.log(r) for r in j.ratios) if len(j.ratios) > 1 else math.nan:.1%} "
            f"over {len(j.ratios)} repeats" for j in judged]


def phase_label(num_requests: int) -> str:
    return f"2/s x{num_requests}"


async def measure(target, phases: dict[int, runner.Phase], repeats: int, log=print) -> dict:
    """Repeat r: every phase size (order alternating) as A then B (order alternating); the figures
    in the framework's result form, sides as targets and sizes as phases."""
    result = results.new_result("workload", "overhead-aa", {
        "targets": list(SIDES), "repeats": repeats, "num_requests": sorted(phases)})
    warm = [dataclasses.replace(item, at=0.0) for item in phases[max(phases)].items]
    await runner.run_phase(target, runner.Phase("warm-up", warm), 0)
    sizes = sorted(phases)
    for repeat in range(repeats):
        for n in sizes if repeat % 2 == 0 else sizes[::-1]:
            for side in SIDES if repeat % 2 == 0 else SIDES[::-1]:
                run = await runner.run_phase(target, phases[n], 0)
                figures = runner.phase_figures(run, phases[n], math.inf, math.inf, probed=False)
                results.add_repeat(result, f"{side} / {phase_label(n)}", figures, n)
                log(f"#{repeat + 1} {phase_label(n):>8} {side}: TTFT p50 {figures['ttft_p50_ms']:6.1f} ms, engine "
                    f"waited {figures.get('engine_wait_ms_per_token', math.nan):.2f} ms/token")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--num-requests", default="12,24", help="comma list of phase sizes, alternated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine-cpus", default="0", help="the engine's CPUs (this process: the others)")
    parser.add_argument("--loaded-wait-ms", type=float, default=math.inf,
                        help="leave out repeats where an engine waited more than this per token (default: none)")
    parser.add_argument("--out", help="write the result JSON here")
    args = parser.parse_args(argv)
    sizes = sorted({int(n) for n in args.num_requests.split(",") if n})
    if args.repeats < 2 or not sizes or sizes[0] < 1:
        parser.error("--repeats must be at least 2 and --num-requests positive")

    from benchmarks.__main__ import load_tokenizer
    from benchmarks.framework.targets import Offline
    from benchmarks.framework.workloads import WORKLOADS, Corpus
    from llm_engine.cli import parse_cpus
    from llm_engine.entrypoints.models import resolve_model

    model, _ = resolve_model(None)
    corpus = Corpus(load_tokenizer(model))
    phases = {n: WORKLOADS["poisson"](corpus, args.seed, rates=(2.0,), num_requests=n).phases[0] for n in sizes}
    engine_cpus = parse_cpus(args.engine_cpus)
    others = set(os.sched_getaffinity(0)) - engine_cpus
    if others:
        os.sched_setaffinity(0, others)
    target = Offline(model, 32, cpus=frozenset(engine_cpus))

    async def run() -> dict:
        try:
            return await measure(target, phases, args.repeats)
        finally:
            await target.aclose()

    result = asyncio.run(run())
    judged = [j for j in paired.judge(result, loaded_wait_ms=args.loaded_wait_ms) if j.figure != "output_tokens_per_s"]
    print(paired.table(judged, "A", args.loaded_wait_ms))
    print("\n".join(log_sd(judged)))
    if args.out:
        results.save(result, args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
