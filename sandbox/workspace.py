"""A run's scratch folder: a size-limited tmpfs owned by a uid no other live run uses.

The tmpfs size is the workspace disk quota (disk fill ends in ENOSPC, not a full host disk) and
unmounting it removes everything the run left. The dedicated host uid makes per-user limits
(RLIMIT_NPROC) per-run and lets cleanup find every process the run owns; it is leased host-wide,
so no other run, of this server or another one on the host, has it at the same time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sandbox.errors import SandboxUnavailable
from sandbox.host_lease import lease_uid
from sandbox.killing import kill_until_gone

UID_BASE = 620000
UID_COUNT = 4096
MNT_DETACH = 2
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_BIND = 0x1000
MS_SHARED = 1 << 20

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_next_uid = secrets.randbelow(UID_COUNT)  # servers on one host start their search at different uids


def runs_root() -> Path:
    root = Path(os.environ.get("CODEYARD_SANDBOX_DIR", "/tmp/codeyard-runs"))
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o711)  # run uids must reach their own workspace, never list the others
    return root


@contextmanager
def run_uid() -> Iterator[int]:
    """Lease a host uid for the duration of one run, then kill anything still running as it.

    A process left over as the uid by a holder that died (its lease went with it) is killed first."""
    global _next_uid
    for _ in range(UID_COUNT):
        uid = UID_BASE + _next_uid
        _next_uid = (_next_uid + 1) % UID_COUNT
        if (lease := lease_uid(uid)) is not None:
            break
    else:
        raise SandboxUnavailable("too many concurrent runs on this host: no free sandbox uid")
    try:
        kill_uid(uid)
        yield uid
    finally:
        kill_uid(uid)
        os.close(lease)


def processes_by_uid(uids: range) -> dict[int, list[int]]:
    """Live (non-zombie) processes whose owner is in uids, grouped by owner (one pass over /proc)."""
    found: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if (uid := entry.stat().st_uid) in uids and _state(entry.name) != "Z":
                    found.setdefault(uid, []).append(int(entry.name))
            except OSError:
                pass
    return found


def processes_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes owned by uid."""
    return processes_by_uid(range(uid, uid + 1)).get(uid, [])


def _state(pid: str) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


def kill_uid(uid: int, *, once: bool = False) -> None:
    """SIGKILL every process of uid, repeatedly until none is left (or one pass with once=True)."""
    kill_until_gone(lambda: processes_of_uid(uid), rounds=1 if once else 100, pause=0.01)


def _mount(source: bytes, target: Path, fstype: bytes | None, flags: int, options: bytes | None = None) -> None:
    if _libc.mount(source, str(target).encode(), fstype, flags, options) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount on {target}: {os.strerror(err)}")


def _mount_tmpfs(path: Path, size: int, inodes: int) -> None:
    _mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, f"size={size},nr_inodes={inodes},mode=0700".encode())


def bind(source: Path, target: Path) -> None:
    """Bind-mount source onto target (which may be a shared mount point that propagates it)."""
    _mount(str(source).encode(), target, None, MS_BIND)


def make_shared_mountpoint(path: Path) -> None:
    """Turn a folder into a mount point whose later mounts propagate to its bind copies (Docker's rslave binds)."""
    _mount(str(path).encode(), path, None, MS_BIND)
    _mount(b"none", path, None, MS_SHARED)


def umount(path: Path) -> None:
    if _libc.umount2(str(path).encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (22,):  # EINVAL: not mounted
            raise OSError(err, f"umount {path}: {os.strerror(err)}")


@contextmanager
def scratch(size: int, inodes: int, owner: int) -> Iterator[Path]:
    """A fresh tmpfs folder of `size` bytes owned by `owner`; unmounted and removed afterwards."""
    if os.geteuid() != 0:
        raise SandboxUnavailable("the sandbox must run as root (it mounts per-run workspaces and switches to per-run uids)")
    path = Path(tempfile.mkdtemp(prefix="run-", dir=runs_root()))
    try:
        _mount_tmpfs(path, size, inodes)
        try:
            os.chown(path, owner, owner)
            yield path
        finally:
            umount(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)
