"""The regression detector proven both ways on the CI gate's own measurement (issue 21): another run
of the same commit is not flagged, and an engine made 20% slower (each step sleeps 20% of its own
duration) is, 10 repeats each; the same-run A/B against the baseline's commit decides. Three gate runs, ~10 min on a quiet 2-core machine: run by
`make test-bench-detector`, not by the default suite."""

from __future__ import annotations

import os

import pytest

from benchmarks.__main__ import main as bench_main

pytestmark = pytest.mark.skipif(not os.environ.get("CODEYARD_BENCH_DETECTOR"), reason="make test-bench-detector")


def test_the_gate_flags_a_slower_engine_and_not_the_same_commit(tmp_path, capsys):
    baseline = str(tmp_path / "baseline.json")
    assert bench_main(["gate", "--repeats", "10", "--baseline", baseline, "--update-baseline"]) == 0
    capsys.readouterr()
    assert bench_main(["gate", "--repeats", "10", "--baseline", baseline]) == 0, capsys.readouterr().out
    same = capsys.readouterr().out
    assert "(decides)" in same and "gate: passed" in same, same  # decided by the same-run A/B
    deciding = same.split("(decides)")[1]
    assert "REGRESSION" not in deciding, same
    # last: the slowdown patches the engine's step for the rest of this process
    assert bench_main(["gate", "--repeats", "10", "--baseline", baseline, "--inject-slowdown", "0.2"]) == 1
    slow = capsys.readouterr().out
    flagged = [line for line in slow.split("(decides)")[1].splitlines() if line.endswith("REGRESSION")]
    assert any("output_tokens_per_s" in line for line in flagged), slow
    assert "accuracy:" not in slow  # flagged for its speed, not for its outputs
