"""`codeyard sandbox rootfs`: the runner's Debian rootfs made ahead of its Docker import (`make test` starts it
beside its first tests), and a second maker waits for the first instead of running debootstrap again."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

from sandbox.image import rootfs_path

CODEYARD = str(Path(sys.executable).with_name("codeyard"))


def rootfs_command(cache: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([CODEYARD, "sandbox", "rootfs"], env={**os.environ, "CODEYARD_CACHE_DIR": str(cache), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_second_maker_waits_for_the_first_and_uses_its_tarball(tmp_path, monkeypatch):
    monkeypatch.setenv("CODEYARD_CACHE_DIR", str(tmp_path))
    tarball = rootfs_path()
    with open(tarball.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # this test is the first maker, mid-build
        # PATH without debootstrap: the waiter would fail at once if it tried to build itself
        waiter = rootfs_command(tmp_path, PATH=str(Path(sys.executable).parent))
        assert waiter.stdout is not None
        assert "waiting for the rootfs that another process is making" in waiter.stdout.readline()
        time.sleep(0.5)
        assert waiter.poll() is None  # it waits while the lock is held
        tarball.write_bytes(b"the first maker's rootfs")
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, err
    assert out.strip().splitlines()[-1] == str(tarball)
    assert tarball.read_bytes() == b"the first maker's rootfs"


def test_without_debootstrap_it_says_so_with_exit_2(tmp_path):
    maker = rootfs_command(tmp_path, PATH=str(Path(sys.executable).parent))
    out, err = maker.communicate(timeout=30)
    assert maker.returncode == 2 and "debootstrap is not installed" in err and "Traceback" not in err

