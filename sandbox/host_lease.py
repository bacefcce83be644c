"""A host-wide lease that every live server (or test session) running code holds while it serves.

`sweep` removes every sandbox process, container and mount on the host; that is right after a
crash, and wrong while another server on the same host is running code. Each server holds a shared
lock on one host-wide file; only a server that can get it exclusively (nobody else is alive) sweeps.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

LEASE_FILE = Path(tempfile.gettempdir()) / "codeyard-sandbox.lease"


class HostLease:
    def __init__(self, path: Path = LEASE_FILE) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def alone(self) -> bool:
        """Whether no other live holder exists; either way this one holds the lease (shared) afterwards."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False
        fcntl.flock(self._fd, fcntl.LOCK_SH)
        return alone

    def close(self) -> None:
        os.close(self._fd)  # releases the lock
