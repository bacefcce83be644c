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


class KeptOpenFile:
    """A small file read again and again from its start through one descriptor, kept open: one
    pread a read, not an open, a read and a close (stop 32): the isolated request that reads
    /proc/loadavg has found the server idle, and runs every call cold. The kernel writes
    /proc/loadavg's text afresh for each read from its start."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None

    def read(self) -> str:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            return os.pread(self.fd, 256, 0).decode()
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


_LOADAVG = KeptOpenFile(LOADAVG)


def others_runnable() -> bool:
    """A runnable task besides the caller, read from /proc/loadavg (the count includes the caller,
    which is running as it reads)."""
    try:
        runnable = runnable_tasks(_LOADAVG.read())
    except (OSError, ValueError):
        return True
    return runnable > 1
