"""Check time: grading built-in lessons in the sandbox, beside a bare sandbox run, same process.

    .venv/bin/python benchmarks/tutorials_bench.py [--runs 20] [--backend bwrap]

For each lesson (unit tests in Python, input/output checks in Python, node:test in JavaScript) it
grades the solution and the starter `--runs` times each, one check at a time as a learner clicks
Check, and prints p50/p99 wall time per check against the goal (p50 < 1 s), and the ratio against
a bare sandbox run of `python3 -c 'print(1)'` measured in the same run (the floor any check pays).
Needs root (the sandbox).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox.backend import Backend, RunSpec  # noqa: E402
from sandbox.backends.choice import make_backend  # noqa: E402
from tutorials.format import builtin_courses  # noqa: E402
from tutorials.grader import grade  # noqa: E402

LESSONS = [("python-from-zero", "functions"), ("python-from-zero", "conditions"), ("javascript-basics", "arrays")]
GOAL_SECONDS = 1.0


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def timed(once, runs: int) -> list[float]:
    await once()  # warm-up, not counted
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        await once()
        samples.append(time.perf_counter() - began)
    return samples


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--backend", default="bwrap", help="auto, docker or bwrap")
    args = parser.parse_args()
    backend: Backend = make_backend(args.backend)
    courses = builtin_courses()
    try:
        with tempfile.TemporaryDirectory() as empty:
            async def bare() -> None:
                result = await backend.run(RunSpec(["python3", "-c", "print(1)"], Path(empty)))
                assert result.stdout == b"1\n", result
            floor = statistics.median(await timed(bare, args.runs))
        print(f"backend {backend.name}, {args.runs} checks per row; bare sandbox run p50 {floor * 1000:.0f} ms")
        print(f"{'lesson':40} {'files':8} {'tests':>5} {'p50 ms':>8} {'p99 ms':>8} {'x bare':>7}  goal p50 < {GOAL_SECONDS:g} s")
        worst = 0.0
        for course_slug, lesson_slug in LESSONS:
            lesson = courses[course_slug].lesson(lesson_slug)
            for label, files, expect_pass in (("solution", lesson.solution_files, True), ("starter", lesson.starter_files, False)):
                counted = []

                async def once() -> None:
                    result = await grade(lesson, files, sandbox=backend)
                    assert result.passed == expect_pass, (lesson.slug, label, result.first_failure)
                    counted.append(len(result.tests))
                samples = await timed(once, args.runs)
                p50, p99 = percentile(samples, 50), percentile(samples, 99)
                worst = max(worst, p50)
                verdict = "ok" if p50 < GOAL_SECONDS else "SLOW"
                print(f"{course_slug + '/' + lesson_slug:40} {label:8} {counted[-1]:>5} {p50 * 1000:>8.0f} {p99 * 1000:>8.0f} "
                      f"{p50 / floor:>7.1f}  {verdict}")
        print(f"slowest p50 {worst * 1000:.0f} ms: {'meets' if worst < GOAL_SECONDS else 'MISSES'} the goal of {GOAL_SECONDS:g} s")
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            await close()


if __name__ == "__main__":
    asyncio.run(main())
