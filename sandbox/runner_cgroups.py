"""At a runner's start: the runs' and apps' cgroups that runners in *other* cgroups left behind.

A runner's runs live under its own cgroup (<runner's cgroup>/codeyard/run-...). A runner killed and started
again in the same cgroup finds its predecessor's there (`sandbox.hosted.remove_stale_cgroups`). One started in
a new cgroup does not: a runner container removed and created anew (`docker compose up` recreating it, swarm
replacing a task: /docker/<new id>), a runner process started by another service or job. Those runners' cgroups
are siblings under one parent (/docker, system.slice, a job manager's folder), so a starting runner looks at
its siblings: one that holds runs' or apps' cgroups and no other process at all has lost its runner (a live
runner, or any live server, is a process in its own cgroup outside its runs), and its runs' and apps' cgroups
are killed and removed.

Processes of another PID namespace (a sibling container) are not listed in cgroup.procs to this one, so
liveness is also read where namespaces do not hide it: pids.current (v1 and v2) and cgroup.events (v2).
"""

from __future__ import annotations

import logging
import os
import posixpath
from pathlib import Path

from sandbox.cgroups import RUNS_FOLDER, RunCgroup, cgroup_dirs, remove_cgroup
from sandbox.hosted import APPS_CGROUP
from sandbox.killing import kill_until_gone

log = logging.getLogger(__name__)
LEFT_BY = {RUNS_FOLDER: "run-", APPS_CGROUP: "app-"}  # folder of a server's cgroup -> its children's prefix


def remove_orphaned_sibling_cgroups() -> list[str]:
    """Kill and remove the runs' and apps' cgroups of sibling cgroups that no process lives in any more;
    returns their paths (relative to the hierarchies' roots)."""
    base = RunCgroup.base_relpath()
    own = posixpath.dirname(base) if base else "/"
    parent = posixpath.dirname(own)
    if own == parent:  # at the root: no siblings, and the host's other cgroups are not a runner's
        return []
    removed: list[str] = []
    siblings = {child.name for folder in cgroup_dirs(parent) for child in folder.iterdir()
                if child.is_dir() and child.name != posixpath.basename(own)}
    for name in sorted(siblings):
        sibling = f"{parent}/{name}"
        left = _left(sibling)
        if not left or _alive(sibling, left):
            continue
        for relpath in left:
            dirs = cgroup_dirs(relpath)
            for folder in dirs:
                _write(folder / "cgroup.kill", "1")  # v2, Linux 5.14+: the whole subtree, whatever its namespace
            kill_until_gone(lambda: [pid for folder in dirs for pid in _procs(folder)], rounds=200, pause=0.005)
            remove_cgroup(relpath)
            if not cgroup_dirs(relpath):
                removed.append(relpath)
    if removed:
        log.warning("removed %d cgroups of runs and apps whose runner's cgroup has no process left: %s",
                    len(removed), ", ".join(removed[:5]))
    return removed


def _left(sibling: str) -> list[str]:
    """The runs' and apps' cgroups under `sibling` (its codeyard folders' run-*/app-* children)."""
    return sorted({f"{sibling}/{folder}/{child.name}" for folder, prefix in LEFT_BY.items()
                   for found in cgroup_dirs(f"{sibling}/{folder}") for child in found.iterdir()
                   if child.is_dir() and child.name.startswith(prefix)})


def _alive(sibling: str, left: list[str]) -> bool:
    """Whether a process lives in `sibling` outside the cgroups in `left` (its server, or anything else)."""
    for top in cgroup_dirs(sibling):
        runs = {top / os.path.relpath(relpath, sibling) for relpath in left}
        holders = {top, *(top / folder for folder in LEFT_BY)}  # populated by the runs; no process of their own on v2
        if _count(top) > sum(_count(run) for run in runs):  # pids.current: every task, whatever its PID namespace
            return True
        for folder, children, _ in os.walk(top):
            path = Path(folder)
            if path in runs:
                children.clear()
            elif _procs(path) or (path not in holders and _populated(path)):
                return True
    return False


def _procs(folder: Path) -> list[int]:
    """The processes of this cgroup that this PID namespace sees (others are left out of cgroup.procs)."""
    try:
        return [pid for line in (folder / "cgroup.procs").read_text().split() if (pid := int(line)) > 0]
    except (OSError, ValueError):
        return []


def _count(folder: Path) -> int:
    """Tasks in this cgroup's subtree by the pids controller (0 where it is not there)."""
    try:
        return int((folder / "pids.current").read_text())
    except (OSError, ValueError):
        return 0


def _populated(folder: Path) -> bool:
    """v2: whether a process lives anywhere in this cgroup's subtree."""
    try:
        return "populated 1" in (folder / "cgroup.events").read_text()
    except OSError:
        return False


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError:
        pass
