"""Block sizes for a kernel, picked once per device and shape bucket by timing, then kept on disk.

Triton's own `@triton.autotune` times its candidates again in every process, and a server would
pay that on each start; here a choice is timed once and saved as JSON under
`cache_root()/autotune/<device>/<kernel>.json` (`CODEYARD_CACHE_DIR`, default
`~/.cache/codeyard/`), keyed by the caller's shape bucket, and stamped with the Triton version
(a new compiler may prefer other sizes). Writes are atomic (a temporary file renamed into place);
a corrupt file is ignored and rewritten; a folder that cannot be written only logs, and the
choice lives in memory for this process.

How a kernel module uses it (one tuner per kernel, created at import):

    from llm_engine.kernels.autotune import Autotuner, shape_bucket

    _TUNER = Autotuner("paged_decode", [{"BLOCK_N": 32, "num_warps": 4}, {"BLOCK_N": 64, "num_warps": 8}])

    def paged_decode(q, k_cache, v_cache, tables, lens, out):
        key = (str(q.dtype), q.shape[1], k_cache.shape[1], q.shape[2], shape_bucket(q.shape[0]))
        config = _TUNER.pick(key, lambda c: _launch(c, q, k_cache, v_cache, tables, lens, out), q.device)
        _launch(config, q, k_cache, v_cache, tables, lens, out)

`run(config)` launches the kernel once with that config; it is called a few times per candidate
while tuning, so it must be safe to repeat (write to the real output or a scratch buffer, never
accumulate into it). A candidate that fails (too much shared memory for this device, a compile
error) is skipped. Off CUDA (the CPU, `TRITON_INTERPRET=1`) timings mean nothing: `pick` returns
the first candidate without running anything, so list the safest config first (`tuned_devices`
says where timing happens; the tests time plain callables on the CPU with it).
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from llm_engine.cache_dir import cache_root

logger = logging.getLogger(__name__)

Config = dict[str, int]
_REPEATS = 5  # timed launches per candidate, after one untimed launch that compiles it


def shape_bucket(n: int) -> int:
    """The power of two at or above n: one tuning serves every size in (bucket / 2, bucket]."""
    return 1 << max(0, n - 1).bit_length()


def device_name(device: torch.device) -> str:
    """A file-name-safe identity of the device's model, e.g. 'NVIDIA-H200-sm90'."""
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", torch.cuda.get_device_name(index))
    return f"{name}-sm{major}{minor}"


def _compiler_version() -> str:
    try:
        import triton
    except ImportError:
        return "none"
    return str(triton.__version__)


class Autotuner:
    """The fastest of a kernel's candidate configs for each (device, key), timed once."""

    def __init__(self, kernel: str, candidates: Sequence[Config], tuned_devices: tuple[str, ...] = ("cuda",)) -> None:
        if not candidates:
            raise ValueError(f"{kernel}: at least one candidate config is needed")
        self.kernel = kernel
        self.candidates = [dict(c) for c in candidates]
        self.tuned_devices = tuned_devices
        self._choices: dict[str, dict[str, Config]] = {}  # device name -> key -> config
        self._lock = threading.Lock()

    @property
    def default(self) -> Config:
        return self.candidates[0]

    def cache_file(self, device: str) -> Path:
        return cache_root() / "autotune" / device / f"{self.kernel}.json"

    def pick(self, key: Sequence[Hashable], run: Callable[[Config], Any], device: torch.device) -> Config:
        """The config to launch with for this key: cached, or timed now (and saved)."""
        if device.type not in self.tuned_devices or len(self.candidates) == 1:
            return self.default
        name, entry = device_name(device), "|".join(map(str, key))
        with self._lock:
            choices = self._choices.get(name)
            if choices is None:
                choices = self._choices[name] = self._read(name)
            config = choices.get(entry)
            if config is None:
                config = choices[entry] = self._tune(run, device)
                self._write(name, entry, config)
            return config

    def _tune(self, run: Callable[[Config], Any], device: torch.device) -> Config:
        best, best_time, error = None, float("inf"), None
        for config in self.candidates:
            try:
                elapsed = time_launches(partial(run, config), device)
            except Exception as exc:  # noqa: BLE001 - a config this device cannot run is skipped
                logger.debug("%s: candidate %s failed: %s", self.kernel, config, exc)
                error = exc
                continue
            if elapsed < best_time:
                best, best_time = config, elapsed
        if best is None:
            raise RuntimeError(f"{self.kernel}: no candidate config ran: {error}") from error
        logger.info("%s: tuned %s (%.1f us per launch)", self.kernel, best, best_time * 1e6)
        return best

    def _read(self, device: str) -> dict[str, Config]:
        """The saved choices that are still candidates, for this Triton version; {} when none."""
        path = self.cache_file(device)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            logger.warning("autotune cache %s unreadable (%s); tuning again", path, exc)
            return {}
        if not isinstance(data, dict) or data.get("triton") != _compiler_version():
            return {}
        choices = data.get("choices")
        if not isinstance(choices, dict):
            logger.warning("autotune cache %s has no choices; tuning again", path)
            return {}
        return {key: config for key, config in choices.items() if config in self.candidates}

    def _write(self, device: str, entry: str, config: Config) -> None:
        """Merge one choice into the file (others' choices kept) and rename it into place."""
        path = self.cache_file(device)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            choices = self._read(device)
            choices[entry] = config
            handle, scratch = tempfile.mkstemp(prefix=f".{self.kernel}-", suffix=".json", dir=path.parent)
            try:
                with os.fdopen(handle, "w") as file:
                    json.dump({"triton": _compiler_version(), "choices": choices}, file, indent=1, sort_keys=True)
                os.replace(scratch, path)
            except BaseException:
                Path(scratch).unlink(missing_ok=True)
                raise
        except OSError as exc:
            logger.warning("autotune choice for %s not saved in %s (%s); it is tuned again next start",
                           self.kernel, path.parent, exc)


def time_launches(launch: Callable[[], Any], device: torch.device, repeats: int = _REPEATS) -> float:
    """Seconds per launch: one untimed launch (compiles, warms caches), then the mean of `repeats`."""
    launch()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        launch()
    synchronize(device)
    return (time.perf_counter() - start) / repeats


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
