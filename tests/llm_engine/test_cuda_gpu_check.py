"""benchmarks/gpu_check.py's plumbing in CI: --quick runs every part on tiny shapes (the CPU, Triton
interpreted, when there is no GPU) and writes its JSON; the full run says "no CUDA device" and
exits 0 without one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import gpu_check  # noqa: E402


def test_quick_mode_prints_every_part_and_writes_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CODEYARD_CACHE_DIR", str(tmp_path / "cache"))
    assert gpu_check.main(["--quick", "--json", str(tmp_path / "out.json")]) == 0
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["errors"] == {}, result["errors"]
    figures = result["figures"]
    for name in ("device copy bandwidth", "decode attention / copy bandwidth", "kv-cache write (8 tokens) bandwidth",
                 "fused_add_rms_norm bandwidth", "silu_and_mul bandwidth", "int4 g64 GEMM M=2 weight bandwidth",
                 "fp8 GEMM M=8", "engine / Transformers padded batches", "TPOT lower with graphs by"):
        assert figures[name]["value"] == figures[name]["value"], name  # a number, not NaN
    assert figures["parity float32 eager: identical sequences"]["met"] is True
    assert "gpu_check: " in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_the_full_run_without_cuda_says_so_and_exits_0(capsys):
    assert gpu_check.main([]) == 0
    assert "gpu_check: no CUDA device" in capsys.readouterr().out
