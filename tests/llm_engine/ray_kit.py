"""A real Ray cluster of two nodes on this machine for `make test-llm-ray` (test_llm_ray.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

RAY = str(Path(sys.executable).with_name("ray"))
NODE_START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def session_members(sids: set[int], named: str = "") -> list[int]:
    """Processes in the given sessions (each Ray node's processes share its `ray start`'s session),
    those whose command line has `named` in it when given (Ray titles an actor's process ray::Class)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[3]) in sids and named in cmdline:
                members.append(int(entry.name))
    return members


class RayCluster:
    """A head and a worker node on this machine, each `ray start --block` in a session of its own, so
    that stopping the cluster ends exactly its processes (not `ray stop`, which ends every Ray process
    on the machine)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes: list[subprocess.Popen[bytes]] = []
        self.address = f"127.0.0.1:{free_port()}"

    def start(self) -> None:
        common = ["--block", "--num-cpus", "3", "--disable-usage-stats", "--node-ip-address", "127.0.0.1",
                  "--min-worker-port", "0", "--max-worker-port", "0", "--object-store-memory", str(80 * 2**20)]
        head = ["--head", "--port", self.address.rsplit(":", 1)[1], "--include-dashboard", "false",
                "--dashboard-port", str(free_port()), "--ray-client-server-port", str(free_port())]
        self._start_node("head", [*head, *common])
        self._wait_for_nodes(1)
        self._start_node("worker", ["--address", self.address, *common])
        self._wait_for_nodes(2)

    def _start_node(self, name: str, args: list[str]) -> None:
        node_args = ["--temp-dir", str(self.root / name), "--dashboard-agent-listen-port", str(free_port()),
                     "--node-manager-port", str(free_port()), "--object-manager-port", str(free_port())]
        log = (self.root / f"{name}.log").open("wb")
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
        env.pop("RAY_ADDRESS", None)
        self.nodes.append(subprocess.Popen([RAY, "start", *args, *node_args], stdout=log, stderr=subprocess.STDOUT,
                                           env=env, start_new_session=True))

    def _wait_for_nodes(self, count: int) -> None:
        """Until the cluster lists `count` live nodes (`ray status` asks the head)."""
        deadline = time.monotonic() + NODE_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if any(node.poll() is not None for node in self.nodes):
                pytest.fail(f"a Ray node exited while starting; see {self.root}/*.log")
            status = subprocess.run([RAY, "status", "--address", self.address], capture_output=True, text=True)
            if status.returncode == 0 and status.stdout.count(" node_") >= count:
                return
            time.sleep(2)
        pytest.fail(f"the Ray cluster did not list {count} nodes within {NODE_START_TIMEOUT_S} s")

    @property
    def sessions(self) -> set[int]:
        return {node.pid for node in self.nodes}  # each `ray start` leads its own session

    def stop(self) -> None:
        sids = self.sessions
        for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            for pid in session_members(sids):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait_s
            while session_members(sids) and time.monotonic() < deadline:
                time.sleep(0.2)
        for node in self.nodes:
            node.wait(timeout=5)
        left = session_members(sids)
        assert not left, f"Ray processes outlived the cluster: {left}"
