"""Per-run control groups (cgroup v1 memory, pids, cpu accounting) where this host lets us create them.

A cgroup gives what rlimits cannot: a memory limit the kernel enforces with an OOM kill we can
detect, a process+thread cap, CPU time and peak memory of the whole run (even of processes that
were never waited for), and a way to kill every process of the run.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from sandbox.killing import kill_until_gone

_CONTROLLERS = ("memory", "pids", "cpuacct")


def _v1_mounts(every: bool = False) -> dict[str, tuple[Path, str]]:
    """controller -> (mount point, root of the hierarchy as mounted); every=True: all v1 hierarchies."""
    mounts: dict[str, tuple[Path, str]] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, extra = left.split(), right.split()
        if extra and extra[0] == "cgroup":
            for ctl in extra[-1].split(","):
                if ctl in _CONTROLLERS or (every and ctl not in ("rw", "ro", "relatime", "noatime")):
                    mounts[ctl] = (Path(fields[4]), fields[3])
    return mounts


def cgroup_dirs(relpath: str) -> list[Path]:
    """The folder of relpath in every v1 hierarchy where it exists (Docker creates it in all of them)."""
    return [d for mnt, root in set(_v1_mounts(every=True).values()) if (d := mnt / os.path.relpath(relpath, root)).is_dir()]


def _self_path(controller: str) -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctls, path = line.split(":", 2)
        if controller in ctls.split(","):
            return path
    return "/"


@dataclass
class RunCgroup:
    """One run's cgroup, the same relative path in each controller's hierarchy."""

    relpath: str  # e.g. /process_api/abc/codeyard/run-1, also usable as Docker's cgroup_parent
    dirs: dict[str, Path]

    @classmethod
    def base_relpath(cls) -> str | None:
        mounts = _v1_mounts()
        if set(mounts) != set(_CONTROLLERS):
            return None
        return _self_path("memory").rstrip("/") + "/codeyard"

    @classmethod
    def create(cls, name: str, memory_bytes: int, pids: int) -> RunCgroup | None:
        """Create the cgroup with its limits; None where cgroup v1 is not writable here."""
        base = cls.base_relpath()
        if base is None:
            return None
        mounts = _v1_mounts()
        relpath = f"{base}/{name}"
        dirs: dict[str, Path] = {}
        try:
            for ctl, (mnt, root) in mounts.items():
                d = mnt / os.path.relpath(relpath, root if root != "/" else "/")
                d.mkdir(parents=True, exist_ok=True)
                dirs[ctl] = d
            mem = dirs["memory"]
            (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
            swap = mem / "memory.memsw.limit_in_bytes"
            if swap.exists():
                swap.write_text(str(memory_bytes))
            (dirs["pids"] / "pids.max").write_text(str(pids))
        except OSError:
            cg = cls(relpath, dirs)
            cg.remove()
            return None
        return cls(relpath, dirs)

    @classmethod
    def existing(cls, relpath: str) -> RunCgroup | None:
        """An existing cgroup (e.g. one Docker made for a container), for reading its figures."""
        dirs = {ctl: mnt / os.path.relpath(relpath, root) for ctl, (mnt, root) in _v1_mounts().items()}
        return cls(relpath, dirs) if len(dirs) == len(_CONTROLLERS) and all(d.is_dir() for d in dirs.values()) else None

    def procs_files(self) -> list[str]:
        """Files a child writes its pid into to join this cgroup (before exec)."""
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def peak_memory(self) -> int:
        return int((self.dirs["memory"] / "memory.max_usage_in_bytes").read_text())

    def oom_killed(self) -> bool:
        for line in (self.dirs["memory"] / "memory.oom_control").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value) > 0
        return int((self.dirs["memory"] / "memory.failcnt").read_text()) > 0

    def cpu_seconds(self) -> float:
        return int((self.dirs["cpuacct"] / "cpuacct.usage").read_text()) / 1e9

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.dirs["pids"] / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroup until none is left (the pids limit bounds forking)."""
        kill_until_gone(self.pids, rounds=200, pause=0.005)

    def remove(self) -> None:
        """Remove the cgroup in every hierarchy (children first, which Docker may still be deleting)."""
        for d in cgroup_dirs(self.relpath):
            for _ in range(100):
                try:
                    for child in sorted((p for p in d.iterdir() if p.is_dir()), reverse=True):
                        child.rmdir()
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
