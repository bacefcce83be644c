"""Leftovers of a crashed server (made here for real) are all removed by sweep."""

from __future__ import annotations

import subprocess

from conftest import leftovers

from sandbox.cgroups import RunCgroup
from sandbox.sweep import sweep
from sandbox.workspace import UID_BASE, runs_root


def test_sweep_removes_what_a_crash_leaves(docker_engine, runner_image):
    uid = UID_BASE + 4000
    orphan = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "600"])
    assert RunCgroup.create("run-crashed", 64 << 20, 16) is not None
    stale = runs_root() / "run-stale"
    stale.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(stale)], check=True)  # never unmounted
    docker_engine.containers.create(runner_image, ["sleep", "600"], labels={"codeyard.sandbox": "crashed"},
                                    cgroup_parent=f"{RunCgroup.base_relpath()}/run-crashed")  # as a run's container
    try:
        found = leftovers(docker_engine)
        assert len(found) >= 5 and any("process" in f for f in found) and any("container" in f for f in found)
        removed = sweep(docker_engine)
        assert any("mount" in r for r in removed) and any("cgroup" in r for r in removed)
        assert leftovers(docker_engine) == []
        assert orphan.wait(5) == -9
    finally:
        orphan.kill()
        orphan.wait()
