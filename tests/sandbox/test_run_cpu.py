"""A run's CPU as a whole (issue 14, defect 4): capped at one CPU, and its CPU-time limit counting
every process of the run, on each backend. Eight spinning processes once used the whole host and,
with a per-process limit only, eight times the run's CPU time."""

from __future__ import annotations

from conftest import make_spec

from sandbox.verdict import Verdict

SPINNERS = "import os\nfor _ in range(7):\n    if os.fork() == 0:\n        break\nwhile True:\n    pass\n"  # 8 processes


async def spin(backend, project, **limits):
    (project / "main.py").write_text(SPINNERS)
    return await backend.run(make_spec(project, ["python3", "main.py"], **limits))


async def test_eight_spinners_share_one_cpu(backend, project):
    """With CPU time to spare, the wall clock ends the run, and the run used at most one CPU meanwhile."""
    result = await spin(backend, project, cpu_seconds=30, wall_seconds=3)
    print(f"\n{backend.name}: 8 spinners, 3 s wall: {result.cpu_seconds:.2f} CPU-s in {result.wall_seconds:.2f} s")
    assert result.verdict == Verdict.TIME_LIMIT, result
    assert result.cpu_seconds <= result.wall_seconds * 1.1, result


async def test_cpu_time_limit_counts_every_process(backend, project):
    """The run stops once all its processes together used its CPU time, not each of them (the wall
    limit is far away: one CPU spends 2 CPU-s in about 2 s)."""
    result = await spin(backend, project, cpu_seconds=2, wall_seconds=20)
    print(f"\n{backend.name}: 8 spinners, 2 CPU-s limit: {result.cpu_seconds:.2f} CPU-s in {result.wall_seconds:.2f} s")
    assert result.verdict == Verdict.TIME_LIMIT, result
    assert 2 <= result.cpu_seconds <= 2.5, result
    assert result.wall_seconds < 10, result
