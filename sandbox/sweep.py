"""Remove what crashed runs left behind: processes of sandbox uids, containers, mounts, folders, cgroups.

A run cleans up after itself; this is for the server's start (after a crash or a kill -9) and for
`codeyard sandbox cleanup`. It assumes no other server on this host is running code right now; even
so, processes of a uid whose host-wide lease is held (a live run, of whatever process) are spared.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from sandbox.cgroups import RunCgroup, cgroup_dirs, remove_cgroup
from sandbox.host_lease import lease_uid
from sandbox.workspace import UID_BASE, UID_COUNT, kill_uid, processes_by_uid, processes_of_uid, runs_root, umount


def sweep(docker: Any = None) -> list[str]:  # docker: a DockerClient (untyped library)
    """Remove every leftover; returns one line per thing removed."""
    removed: list[str] = []
    for uid in sorted(processes_by_uid(range(UID_BASE, UID_BASE + UID_COUNT))):
        if (lease := lease_uid(uid)) is None:
            continue
        try:
            if processes_of_uid(uid):
                kill_uid(uid)
                removed.append(f"processes of sandbox uid {uid}")
        finally:
            os.close(lease)
    if docker is not None:
        from sandbox.backends.docker import LABEL, POOL_LABEL

        for label in (LABEL, POOL_LABEL):
            for container in docker.containers.list(all=True, filters={"label": label}):
                container.remove(force=True, v=True)
                removed.append(f"container {container.name}")
    root = runs_root()
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(f"{root}/")), key=len, reverse=True):
        umount(Path(mount))
        removed.append(f"mount {mount}")
    for child in root.iterdir():
        shutil.rmtree(child, ignore_errors=True)
        removed.append(f"folder {child}")
    base = RunCgroup.base_relpath()
    if base:
        for parent in cgroup_dirs(base):
            for child in parent.iterdir():
                if child.is_dir():
                    remove_cgroup(f"{base}/{child.name}")
                    removed.append(f"cgroup {child}")
    return removed
