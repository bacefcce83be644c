"""When the layers run their Triton kernels (fused norm/rotary/SiLU, quantized GEMMs): always on
CUDA tensors; on CPU tensors only when CODEYARD_TRITON_ON_CPU=1 asks for it, which tests do to run
the GPU path in Triton's interpreter (TRITON_INTERPRET=1) and compare it with the CPU path.

It imports no Triton: the CPU engine never loads it.
"""

from __future__ import annotations

import os

import torch

ON_CPU_ENV = "CODEYARD_TRITON_ON_CPU"


def use_triton(x: torch.Tensor) -> bool:
    if x.is_cuda:
        return True
    if os.environ.get(ON_CPU_ENV) != "1":
        return False
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"{ON_CPU_ENV}=1 runs Triton kernels on CPU tensors, which needs TRITON_INTERPRET=1 "
                           f"set before Triton is imported")
    return True
