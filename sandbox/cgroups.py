"""Per-run control groups, cgroup v1 or v2, whichever the host mounts with the controllers we need.

A cgroup gives what rlimits cannot: a memory limit the kernel enforces with an OOM kill we can
detect, a process+thread cap, CPU time and peak memory of the whole run (even of processes that
were never waited for), and a way to kill every process of the run.

v1 (separate memory, pids and cpuacct hierarchies) is used where those are mounted; else v2 (one
unified hierarchy with memory, pids and cpu available to our own cgroup). Either way a run's cgroup
lives at the same relative path, <our cgroup>/codeyard/<name>, also usable as Docker's cgroup_parent.
"""

from __future__ import annotations

import abc
import errno
import functools
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from sandbox.killing import kill_until_gone

log = logging.getLogger(__name__)

V1_CONTROLLERS = ("memory", "pids", "cpuacct")
V2_CONTROLLERS = ("memory", "pids", "cpu")
V2_SERVER_LEAF = "codeyard-server"  # where our cgroup's own processes move so it may delegate controllers
CPU_PERIOD_US = 100_000  # cpu.max: one CPU, as Docker's runs get
RUNS_FOLDER = "codeyard"


@functools.cache
def _mountinfo() -> tuple[tuple[Path, str, str, list[str]], ...]:
    """(mount point, root of the mounted hierarchy, fs type, super options) of each mount.

    Read once: cgroup hierarchies are mounted before the server starts, and every run asked
    several times."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, extra = left.split(), right.split()
        if len(extra) >= 3:
            mounts.append((Path(fields[4]), fields[3], extra[0], extra[-1].split(",")))
    return tuple(mounts)


def _v1_mounts(every: bool = False) -> dict[str, tuple[Path, str]]:
    """controller -> (mount point, root of the hierarchy as mounted); every=True: all v1 hierarchies."""
    mounts: dict[str, tuple[Path, str]] = {}
    for point, root, fstype, options in _mountinfo():
        if fstype == "cgroup":
            for ctl in options:
                if ctl in V1_CONTROLLERS or (every and ctl not in ("rw", "ro", "relatime", "noatime")):
                    mounts[ctl] = (point, root)
    return mounts


def _v2_mount() -> tuple[Path, str] | None:
    """(mount point, root) of the unified (cgroup2) hierarchy, if mounted."""
    return next(((point, root) for point, root, fstype, _ in _mountinfo() if fstype == "cgroup2"), None)


def _self_path(controller: str) -> str:
    """Our own cgroup in the v1 hierarchy of `controller`, or in the unified one for controller ''."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, ctls, path = line.split(":", 2)
        if (controller in ctls.split(",")) if controller else (hierarchy == "0" and ctls == ""):
            return path
    return "/"


def _in_hierarchy(point: Path, root: str, relpath: str) -> Path:
    return point / os.path.relpath(relpath, root)


def cgroup_dirs(relpath: str) -> list[Path]:
    """The folder of relpath in every hierarchy, v1 and v2, where it exists (Docker creates it in all of them)."""
    hierarchies = set(_v1_mounts(every=True).values()) | ({v2} if (v2 := _v2_mount()) else set())
    return [d for point, root in hierarchies if (d := _in_hierarchy(point, root, relpath)).is_dir()]


def _folders_below(top: Path) -> list[Path]:
    """Child cgroups of top, parents before children. os.walk tells folders by their directory
    entries; rglob stat()ed each of the dozens of control files of every cgroup."""
    return [Path(folder) / name for folder, names, _ in os.walk(top) for name in names]


def remove_cgroup(relpath: str) -> None:
    """Remove relpath in every hierarchy (children first, which Docker may still be deleting)."""
    for d in cgroup_dirs(relpath):
        for _ in range(100):
            try:
                for child in reversed(_folders_below(d)):
                    child.rmdir()
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


def _v2_available() -> tuple[Path, str] | None:
    """The unified hierarchy, where our own cgroup can hand memory, pids and cpu to children."""
    v2 = _v2_mount()
    if v2 is None:
        return None
    own = _in_hierarchy(*v2, _self_path(""))
    try:
        available = set((own / "cgroup.controllers").read_text().split())
    except OSError:
        return None
    return v2 if set(V2_CONTROLLERS) <= available else None


class RunCgroup(abc.ABC):
    """One run's cgroup: join it before exec, read its figures afterwards, kill all of it, remove it."""

    relpath: str  # e.g. /process_api/abc/codeyard/run-1, also usable as Docker's cgroup_parent

    @staticmethod
    def base_relpath(folder: str = RUNS_FOLDER) -> str | None:
        """Where runs' cgroups go (<our cgroup>/codeyard), or None where no usable cgroup version is mounted.
        On v1 a long-lived kind (deployed apps) may have a folder of its own beside it."""
        if set(_v1_mounts()) == set(V1_CONTROLLERS):
            return f"{_self_path('memory').rstrip('/')}/{folder}"
        if _v2_available() is not None:
            return f"{_self_path('').rstrip('/')}/{RUNS_FOLDER}"
        return None

    @staticmethod
    def create(name: str, memory_bytes: int, pids: int, folder: str = RUNS_FOLDER, cpus: float = 1.0) -> RunCgroup | None:
        """Create the cgroup with its limits, a CPU quota among them (`cpus`: one for runs, as Docker's
        --cpus=1; a deployed app's may differ), so no run takes the whole host; None where this host gives
        us no writable cgroups.
        v1: in <our cgroup>/<folder> (the quota where the cpu controller is mounted). v2: always in
        the runs' folder (where our cgroup delegates)."""
        if set(_v1_mounts()) == set(V1_CONTROLLERS):
            return CgroupV1.create(name, memory_bytes, pids, folder, cpus)
        if (v2 := _v2_available()) is not None:
            relpath = f"{_self_path('').rstrip('/')}/{RUNS_FOLDER}"
            return CgroupV2.create_in(_in_hierarchy(*v2, relpath), relpath, name, memory_bytes, pids, cpus)
        return None

    @staticmethod
    def existing(relpath: str) -> RunCgroup | None:
        """An existing cgroup (e.g. one Docker made for a container), for reading its figures."""
        if set(_v1_mounts()) == set(V1_CONTROLLERS):
            return CgroupV1.existing(relpath)
        if (v2 := _v2_available()) is not None and (d := _in_hierarchy(*v2, relpath)).is_dir():
            return CgroupV2(relpath, d)
        return None

    @abc.abstractmethod
    def procs_files(self) -> list[str]:
        """Files a child writes its pid into to join this cgroup (before exec)."""

    @abc.abstractmethod
    def peak_memory(self) -> int: ...

    @abc.abstractmethod
    def oom_killed(self) -> bool: ...

    @abc.abstractmethod
    def cpu_seconds(self) -> float: ...

    @abc.abstractmethod
    def pids(self) -> list[int]: ...

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroup until none is left (the pids limit bounds forking)."""
        kill_until_gone(self.pids, rounds=200, pause=0.005)

    def remove(self) -> None:
        remove_cgroup(self.relpath)


@dataclass
class CgroupV1(RunCgroup):
    """The same relative path in the memory, pids and cpuacct hierarchies."""

    relpath: str
    dirs: dict[str, Path]

    @classmethod
    def create(cls, name: str, memory_bytes: int, pids: int, folder: str = RUNS_FOLDER, cpus: float = 1.0) -> CgroupV1 | None:
        relpath = f"{_self_path('memory').rstrip('/')}/{folder}/{name}"
        mounts = _v1_mounts(every=True)
        dirs: dict[str, Path] = {}
        try:
            for ctl in (*V1_CONTROLLERS, "cpu"):
                if ctl in mounts:
                    dirs[ctl] = _in_hierarchy(*mounts[ctl], relpath)
                    dirs[ctl].mkdir(parents=True, exist_ok=True)
            mem = dirs["memory"]
            (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
            swap = mem / "memory.memsw.limit_in_bytes"
            if swap.exists():
                swap.write_text(str(memory_bytes))
            (dirs["pids"] / "pids.max").write_text(str(pids))
        except OSError:
            remove_cgroup(relpath)
            return None
        if "cpu" in dirs:
            try:
                period = int((dirs["cpu"] / "cpu.cfs_period_us").read_text())
                (dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(round(period * cpus)))
            except OSError:
                log.warning("no CPU quota on this host (the cgroup v1 cpu controller refused it)")
        return cls(relpath, dirs)

    @classmethod
    def existing(cls, relpath: str) -> CgroupV1 | None:
        dirs = {ctl: _in_hierarchy(point, root, relpath) for ctl, (point, root) in _v1_mounts().items()}
        return cls(relpath, dirs) if len(dirs) == len(V1_CONTROLLERS) and all(d.is_dir() for d in dirs.values()) else None

    def procs_files(self) -> list[str]:
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
        """0 once the cgroup is gone (Docker may remove a container's cgroups under ours): the
        run's rusage still counts, and a vanished cgroup must not turn a verdict into internal_error."""
        try:
            return int((self.dirs["cpuacct"] / "cpuacct.usage").read_text()) / 1e9
        except FileNotFoundError:
            return 0.0

    def pids(self) -> list[int]:
        """Processes of the run's cgroup and of any below it (Docker's container cgroup), as in v2."""
        return _procs_below(self.dirs["pids"])


def _procs_below(top: Path) -> list[int]:
    found = []
    for folder in (top, *_folders_below(top)):
        try:
            found += [int(p) for p in (folder / "cgroup.procs").read_text().split()]
        except OSError:
            pass
    return found


def _keyed(path: Path) -> dict[str, int]:
    """A flat-keyed cgroup v2 file (memory.events, cpu.stat) as a dict; {} where it is missing."""
    try:
        return {k: int(v) for k, _, v in (line.partition(" ") for line in path.read_text().splitlines()) if v.isdigit()}
    except OSError:
        return {}


def _delegate(folder: Path) -> None:
    """Let folder's children use memory, pids and cpu (v2's subtree_control)."""
    control = folder / "cgroup.subtree_control"
    if set(V2_CONTROLLERS) <= {c.lstrip("+") for c in control.read_text().split()}:
        return
    try:
        control.write_text(" ".join(f"+{c}" for c in V2_CONTROLLERS))
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
        # "No internal processes": a cgroup holding processes (ours) cannot delegate; move them to a leaf first
        leaf = folder / V2_SERVER_LEAF
        leaf.mkdir(exist_ok=True)
        for pid in (folder / "cgroup.procs").read_text().split():
            try:
                (leaf / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # exited meanwhile
        control.write_text(" ".join(f"+{c}" for c in V2_CONTROLLERS))


@dataclass
class CgroupV2(RunCgroup):
    """One folder in the unified hierarchy, with memory, pids and cpu enabled for it."""

    relpath: str
    dir: Path

    @classmethod
    def create_in(cls, base: Path, base_relpath: str, name: str, memory_bytes: int, pids: int,
                  cpus: float = 1.0) -> CgroupV2 | None:
        """Make base/name (base = our cgroup's codeyard folder) with the run's limits; None if refused."""
        folder = base / name
        try:
            _delegate(base.parent)
            base.mkdir(exist_ok=True)
            _delegate(base)
            folder.mkdir()
            (folder / "memory.max").write_text(str(memory_bytes))
            if (folder / "memory.swap.max").exists():
                (folder / "memory.swap.max").write_text("0")  # memory + swap = memory, as v1's memsw limit
            (folder / "memory.oom.group").write_text("1")  # an OOM kills the whole run, not one process of it
            (folder / "pids.max").write_text(str(pids))
            (folder / "cpu.max").write_text(f"{round(CPU_PERIOD_US * cpus)} {CPU_PERIOD_US}")
        except OSError:
            remove_cgroup(f"{base_relpath}/{name}")
            return None
        return cls(f"{base_relpath}/{name}", folder)

    def procs_files(self) -> list[str]:
        return [str(self.dir / "cgroup.procs")]

    def peak_memory(self) -> int:
        try:
            return int((self.dir / "memory.peak").read_text())  # Linux 5.19+
        except OSError:
            return 0

    def oom_killed(self) -> bool:
        return _keyed(self.dir / "memory.events").get("oom_kill", 0) > 0

    def cpu_seconds(self) -> float:
        return _keyed(self.dir / "cpu.stat").get("usage_usec", 0) / 1e6

    def pids(self) -> list[int]:
        """Processes of the run's cgroup and of any below it (Docker's container cgroup)."""
        return _procs_below(self.dir)

    def kill_all(self) -> None:
        try:
            (self.dir / "cgroup.kill").write_text("1")  # Linux 5.14+: the kernel kills the whole subtree at once
        except OSError:
            pass
        super().kill_all()
