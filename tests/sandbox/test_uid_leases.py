"""Run uids are leased host-wide: two server processes on one host never hand out the same uid at
once, sweep spares a uid someone holds, and a uid held by a process that died is free again (its
leftover processes are killed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from sandbox_fixtures import REPO

from sandbox import workspace
from sandbox.sweep import sweep
from sandbox.workspace import UID_BASE, processes_of_uid, run_uid

# Leases `count` uids, searching from the first one (as two freshly started servers might), prints
# them, and holds them until its stdin closes.
HOLDER = """
import contextlib, sys
from sandbox import workspace
workspace._next_uid = int(sys.argv[2])
with contextlib.ExitStack() as held:
    uids = [held.enter_context(workspace.run_uid()) for _ in range(int(sys.argv[1]))]
    print(" ".join(map(str, uids)), flush=True)
    sys.stdin.read()
"""


def holder(count: int, start: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(count), str(start)], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_two_processes_allocating_at_once_get_different_uids():
    first, second = holder(300), holder(300)
    try:
        uids = [set(map(int, p.stdout.readline().split())) for p in (first, second)]
        assert len(uids[0]) == len(uids[1]) == 300
        assert uids[0].isdisjoint(uids[1])
    finally:
        for p in (first, second):
            p.stdin.close()
            assert p.wait(30) == 0


def test_a_dead_holders_uid_is_free_again_and_its_leftovers_are_killed(monkeypatch):
    dead = holder(1, start=4001)
    uid = int(dead.stdout.readline())
    assert uid == UID_BASE + 4001
    orphan = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "600"])
    try:
        deadline = time.monotonic() + 5  # setpriv takes the uid a moment after it starts
        while orphan.pid not in processes_of_uid(uid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert orphan.pid in processes_of_uid(uid)
        monkeypatch.setattr(workspace, "_next_uid", 4001)
        with run_uid() as taken:  # still held by the live holder: the next uid
            assert taken == uid + 1
        assert not any(str(uid) in line for line in sweep()) and orphan.poll() is None  # a live lease is spared
        dead.kill()
        dead.wait()
        monkeypatch.setattr(workspace, "_next_uid", 4001)
        with run_uid() as taken:
            assert taken == uid
            assert orphan.wait(5) == -9 and processes_of_uid(uid) == []
    finally:
        orphan.kill()
        orphan.wait()
