"""Host-wide leases: one every live server (or test session) running code holds, and one per run uid.

`sweep` removes every sandbox process, container and mount on the host; that is right after a
crash, and wrong while another server on the same host is running code. Each server holds a shared
lock on one host-wide file; only a server that can get it exclusively (nobody else is alive) sweeps.

Run uids are leased host-wide the same way, so two servers on one host never hand out the same uid:
each uid has its own lock file, held with flock (per open file, so it also separates runs of one
process) and released by the kernel when the holder closes it or dies.
"""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
from pathlib import Path

from sandbox.errors import SandboxUnavailable

LEASE_FILE = Path(tempfile.gettempdir()) / "codeyard-sandbox.lease"
# /run where we may write (a tmpfs that nothing ages out, unlike /tmp, whose cleaners could delete a held lock file)
UID_LEASES_DIR = Path("/run" if os.access("/run", os.W_OK) else tempfile.gettempdir()) / "codeyard-sandbox-uids"


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


def _uid_leases_dir() -> Path:
    """The folder of per-uid lock files: ours alone (a folder someone else planted in /tmp is refused)."""
    try:
        os.mkdir(UID_LEASES_DIR, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(UID_LEASES_DIR)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise SandboxUnavailable(f"{UID_LEASES_DIR} is not a folder owned by this user and writable only by it; remove it")
    return UID_LEASES_DIR


def lease_uid(uid: int) -> int | None:
    """Hold `uid` host-wide: the descriptor to close to release it, or None when another run holds it."""
    fd = os.open(_uid_leases_dir() / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
