"""Where the Triton kernel tests run: on CUDA when there is a GPU, else on the CPU in Triton's
interpreter.

Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when the module that defines it is
first imported, and keeps that choice for the process. So this module sets it (without CUDA)
before any kernel module is imported: `tests/llm_engine/conftest.py` imports it, which pytest
does before it collects any test module of this folder; test files elsewhere import it first.
With a GPU the kernels compile for it and the CPU variants skip (one process cannot do both).
"""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

# Parametrize a test's `device` with these: "cpu" runs under the interpreter, "cuda" on the GPU.
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="Triton on CPU tensors needs TRITON_INTERPRET=1")),
    pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA device")),
]


def assert_close_to_reference(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal up to rounding, relative to the output's scale: float32 to summation order; bf16 to
    two bf16 steps, since the interpreter rounds float32 to bf16 toward zero (the GPU and torch
    round to nearest)."""
    tol = 2e-5 if expected.dtype == torch.float32 else 2e-2
    expected = expected.float()
    scale = float(expected.abs().max()) or 1.0
    torch.testing.assert_close(actual.float().cpu(), expected.cpu(), rtol=tol, atol=tol * scale)
