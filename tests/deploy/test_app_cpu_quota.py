"""codeyard.toml's deploy.cpus becomes the CPU quota of each instance's real cgroup (v1 or v2, as this host has)."""

from __future__ import annotations

import secrets

import pytest

from deploy_service.instance import APP_LIMITS
from sandbox.cgroups import CgroupV1
from sandbox.hosted import app_cgroup


def test_an_instance_cgroup_gets_the_cpus_asked_for():
    cgroup = app_cgroup(f"app-test-{secrets.token_hex(4)}", APP_LIMITS, cpus=0.5)
    if cgroup is None:
        pytest.fail("this host gives no writable cgroups (run the tests as root)")
    try:
        if isinstance(cgroup, CgroupV1):
            cpu = cgroup.dirs["cpu"]
            period = int((cpu / "cpu.cfs_period_us").read_text())
            assert int((cpu / "cpu.cfs_quota_us").read_text()) == period // 2
        else:
            quota, period = (cgroup.dir / "cpu.max").read_text().split()
            assert int(quota) * 2 == int(period)
    finally:
        cgroup.remove()
