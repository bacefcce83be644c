"""When the layers run their Triton kernels (fused norm/rotary/SiLU, quantized GEMMs): always on
CUDA tensors; on CPU tensors only when `on_cpu` is set (CODEYARD_TRITON_ON_CPU=1 at start-up, or
tests with monkeypatch), to run the GPU path in Triton's interpreter (TRITON_INTERPRET=1) and
compare it with the CPU path.

The check runs several times per layer on the CPU path too, so it is one attribute test there (the
environment is read once), and this module imports no Triton: the CPU engine never loads it.
"""

from __future__ import annotations

import os

import torch

ON_CPU_ENV = "CODEYARD_TRITON_ON_CPU"
on_cpu = os.environ.get(ON_CPU_ENV) == "1"


def use_triton(x: torch.Tensor) -> bool:
    if x.is_cuda:
        return True
    if not on_cpu:
        return False
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"{ON_CPU_ENV}=1 runs Triton kernels on CPU tensors, which needs TRITON_INTERPRET=1 "
                           f"set before Triton is imported")
    return True
