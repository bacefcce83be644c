"""Builds and loads the engine's C++ CPU kernels (csrc/) on first use.

The source is compiled once per machine with the system C++ compiler (-march=native, OpenMP) into
a cache folder keyed by the source, the flags and the CPU's features, then loaded with ctypes. The
shared library links the same libgomp that torch has already loaded, so kernels and torch share
one thread pool. Set CODEYARD_KERNEL_CACHE to choose the folder.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).parent / "csrc" / "paged_attention.cpp"
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]


class KernelBuildError(RuntimeError):
    """The C++ kernels could not be compiled or loaded on this machine."""


def _cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "codeyard" / "kernels"
    return Path(os.environ.get("CODEYARD_KERNEL_CACHE") or default)


def _cpu_flags() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((line for line in lines if line.startswith("flags")), "")


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        result = subprocess.run([compiler, *FLAGS, "-o", str(partial), str(SOURCE)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise KernelBuildError(f"{compiler} failed: {result.stderr.strip()[-2000:]}")
        partial.replace(target)  # atomic: concurrent builders never see a half-written library


@functools.cache
def load_kernels() -> ctypes.CDLL:
    """The compiled kernel library, building it first if this machine has no cached copy."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise KernelBuildError("no C++ compiler found (install g++ or set CXX)")
    key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), " ".join(FLAGS).encode(), compiler.encode(),
                                      _cpu_flags().encode()])).hexdigest()[:16]
    target = _cache_dir() / f"paged_attention-{key}.so"
    if not target.is_file():
        _build(compiler, target)
    try:
        library = ctypes.CDLL(str(target))
    except OSError as exc:
        raise KernelBuildError(f"cannot load {target}: {exc}") from exc
    pointer, i32 = ctypes.c_void_p, ctypes.c_int
    for name in ("paged_decode_f32", "paged_decode_bf16"):
        function = getattr(library, name)
        function.argtypes = [pointer] * 6 + [i32] * 6 + [ctypes.c_float]
        function.restype = None
    return library
