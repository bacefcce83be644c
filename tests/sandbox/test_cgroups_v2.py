"""cgroup v2. This host mounts the memory, pids and cpu controllers as v1, so the v2 limits cannot be
enforced here: the choice of version and the limit files are checked against a folder laid out as
the kernel lays out cgroup2, and joining, CPU time, listing and killing against the host's real (but
controller-less) cgroup2 mount."""

from __future__ import annotations

import errno
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox import cgroups
from sandbox.backends.bwrap import JOIN_CGROUPS
from sandbox.cgroups import CgroupV2, RunCgroup


@pytest.fixture
def unified(tmp_path, monkeypatch) -> Path:
    """A host with no v1 controllers and a cgroup2 tree whose own cgroup (/server) may delegate memory, pids, cpu."""
    own = tmp_path / "server"
    (own / "codeyard").mkdir(parents=True)
    for folder in (own, own / "codeyard"):
        (folder / "cgroup.subtree_control").write_text("")
        (folder / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    monkeypatch.setattr(cgroups, "_v1_mounts", lambda every=False: {})
    monkeypatch.setattr(cgroups, "_v2_mount", lambda: (tmp_path, "/"))
    monkeypatch.setattr(cgroups, "_self_path", lambda controller: "/server")
    return own


def test_without_v1_controllers_runs_get_a_v2_cgroup_with_every_limit(unified):
    assert RunCgroup.base_relpath() == "/server/codeyard"
    cgroup = RunCgroup.create("run-1", 64 << 20, 16)
    assert isinstance(cgroup, CgroupV2) and cgroup.relpath == "/server/codeyard/run-1"
    run = unified / "codeyard" / "run-1"
    assert {name: (run / name).read_text() for name in ("memory.max", "pids.max", "cpu.max", "memory.oom.group")} == {
        "memory.max": str(64 << 20), "pids.max": "16", "cpu.max": "100000 100000", "memory.oom.group": "1"}
    for folder in (unified, unified / "codeyard"):  # each level hands the controllers down
        assert (folder / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert cgroup.procs_files() == [str(run / "cgroup.procs")]


def test_v2_figures_and_the_memory_verdict_come_from_the_kernels_files(unified):
    cgroup = RunCgroup.create("run-2", 64 << 20, 16)
    assert (cgroup.oom_killed(), cgroup.peak_memory(), cgroup.cpu_seconds()) == (False, 0, 0.0)  # files not there yet
    run = unified / "codeyard" / "run-2"
    (run / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\noom_group_kill 1\n")
    (run / "memory.peak").write_text("52428800\n")
    (run / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n")
    assert (cgroup.oom_killed(), cgroup.peak_memory(), cgroup.cpu_seconds()) == (True, 50 << 20, 1.5)
    (run / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 0\noom_kill 0\n")  # hit the limit, reclaimed, no kill
    assert not cgroup.oom_killed()


def test_a_refused_limit_means_no_cgroup(unified):
    (unified / "codeyard" / "cgroup.subtree_control").unlink()  # what a kernel says when we may not delegate
    assert RunCgroup.create("run-3", 64 << 20, 16) is None
    assert not (unified / "codeyard" / "run-3").exists()


def test_a_real_cgroup2_folder_joins_counts_lists_and_kills():
    mount = cgroups._v2_mount()
    if mount is None:
        pytest.skip("this host has no cgroup2 mount")
    relpath = f"{cgroups._self_path('').rstrip('/')}/codeyard-v2-test-{secrets.token_hex(4)}"
    folder = cgroups._in_hierarchy(*mount, relpath)
    folder.mkdir()
    cgroup = CgroupV2(relpath, folder)
    busy = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\ntime.sleep(600)\n"
    proc = subprocess.Popen(["/bin/sh", "-c", JOIN_CGROUPS, "sh", *cgroup.procs_files(), "--", sys.executable, "-c", busy])
    try:
        deadline = time.monotonic() + 20
        while cgroup.cpu_seconds() < 0.35 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cgroup.cpu_seconds() >= 0.35 and cgroup.pids() == [proc.pid]
        cgroup.kill_all()
        assert proc.wait(5) == -9 and cgroup.pids() == []
    finally:
        proc.kill()
        proc.wait()
        cgroup.remove()
    assert not folder.exists()


def test_a_cgroup_holding_processes_moves_them_to_a_leaf_before_delegating(unified, monkeypatch):
    """v2's "no internal processes" rule: the kernel answers EBUSY while our own cgroup holds processes."""
    (unified / "cgroup.procs").write_text("4242\n")
    real_write = Path.write_text
    refused = []

    def write_text(self, text, *args, **kwargs):
        if self == unified / "cgroup.subtree_control" and not (unified / "codeyard-server" / "cgroup.procs").exists():
            refused.append(text)
            raise OSError(errno.EBUSY, "Device or resource busy")
        return real_write(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    assert isinstance(RunCgroup.create("run-4", 64 << 20, 16), CgroupV2)
    assert refused and (unified / "codeyard-server" / "cgroup.procs").read_text() == "4242"
    assert (unified / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"


def test_a_cgroup_with_half_a_cpu_gets_half_the_quota(unified):
    RunCgroup.create("app-1", 64 << 20, 16, cpus=0.5)
    assert (unified / "codeyard" / "app-1" / "cpu.max").read_text() == "50000 100000"
