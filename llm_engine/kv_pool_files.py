"""The files under /dev/shm that hold prefill instances' KV pools (the "shm" KV transport), and the
sweep that removes those whose process is gone. Without torch, so the --disaggregated launcher
and the Ray driver can sweep without loading it.

A producer holds a shared lock on its pool file for as long as it lives; the kernel drops a
process's locks when it ends, however it ends. So a file whose exclusive lock can be taken has
no owner left. That holds across pid namespaces and pid reuse, which a check of the pid in the
name would not.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import secrets
import tempfile
from pathlib import Path

POOL_PREFIX = "codeyard-kv-"
_locks: dict[Path, int] = {}  # this process's pool files: the descriptor holding each one's lock


def pool_folder() -> Path:
    """Where pool files live: /dev/shm (memory) where it exists."""
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def new_pool_file() -> Path:
    """A new empty file that only this user can open, locked by this process until `remove_pool`
    or exit; dead processes' files are swept first."""
    folder = pool_folder()
    sweep_dead_pools(folder)
    while True:
        path = folder / f"{POOL_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        os.close(fd)  # another process's sweep took the file before it was locked: take another name
    _locks[path] = fd
    atexit.register(remove_pool, path)
    return path


def remove_pool(path: Path) -> None:
    """Remove a pool file of this process (mappings of it stay valid) and drop its lock."""
    path.unlink(missing_ok=True)
    if (fd := _locks.pop(path, None)) is not None:
        os.close(fd)


def sweep_dead_pools(folder: Path | None = None) -> list[Path]:
    """Remove this user's pool files that no live process holds: a producer killed by SIGKILL or
    `ray.kill` skips its own cleanup, and each file is as large as its KV pool. Returns them."""
    removed = []
    for path in (folder or pool_folder()).glob(POOL_PREFIX + "*"):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:  # gone meanwhile, or not ours to open
            continue
        try:
            if os.fstat(fd).st_uid != os.getuid():
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live process's pool
            path.unlink(missing_ok=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed
