"""Whether any task besides the caller is runnable right now (running, or waiting for a CPU): read
from /proc/loadavg's count of runnable scheduling entities (threads included, the caller among
them), a snapshot, not the load averages' minutes. Where it cannot be read, the answer is yes: a
caller that waits longer when others may be at work stays on the safe side.
"""

from __future__ import annotations

import os

LOADAVG = "/proc/loadavg"


def runnable_tasks(loadavg: str) -> int:
    """The runnable count in /proc/loadavg's text ("0.52 0.40 0.77 3/110 25248": 3)."""
    fields = loadavg.split()
    if len(fields) < 4 or "/" not in fields[3]:
        raise ValueError(f"not /proc/loadavg's format: {loadavg!r}")
    return int(fields[3].partition("/")[0])


# /proc/loadavg stays open: each read is one pread from its start (the kernel writes the text
# afresh), not an open, a read and a close (stop 32): the isolated request that reads it has found
# the server idle, and runs every call cold.
_OPEN: dict[str, int] = {}


def _read(path: str) -> str:
    if path != LOADAVG:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))  # ~2 us; Path.read_text takes ~10
        try:
            return os.read(fd, 256).decode()
        finally:
            os.close(fd)
    if path not in _OPEN:
        _OPEN[path] = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    fd = _OPEN[path]
    try:
        return os.pread(fd, 256, 0).decode()
    except OSError:
        del _OPEN[path]
        os.close(fd)
        raise


def others_runnable(loadavg: str = LOADAVG) -> bool:
    """A runnable task besides the caller, read from the file at `loadavg` (the count includes the
    caller, which is running as it reads)."""
    try:
        runnable = runnable_tasks(_read(loadavg))
    except (OSError, ValueError):
        return True
    return runnable > 1
