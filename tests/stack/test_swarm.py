"""The same docker-compose.yml as a Docker Swarm stack on a one-node swarm (`docker stack deploy`), the node
labelled for runners: the smoke part (sign up, edit on two replicas, run code on a runner) through the proxy, and the
runners named after their node.
Runs after test_stack.py (which has taken its stack down: both use the same host ports)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from stack_kit import User, eventually, stack_answering
from test_stack import ENV, app_hosts

REPO = Path(__file__).resolve().parents[2]
STACK = "codeyard-swarm-test"
# The engine's socket the runner tasks start their workers through (docker/swarm.yml): ours, where DOCKER_HOST names one
SOCKET = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://")


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], cwd=REPO, env={**os.environ, **ENV, "DOCKER_SOCKET": SOCKET}, capture_output=True, text=True,
                          check=check, timeout=600)


@pytest.fixture(scope="module")
def swarm():
    subprocess.run(["bash", "scripts/stack-secrets.sh"], cwd=REPO, check=True)
    made = docker("info", "--format", "{{.Swarm.LocalNodeState}}").stdout.strip() != "active"
    if made:
        docker("swarm", "init", "--advertise-addr", "127.0.0.1")
    node = docker("node", "ls", "--format", "{{json .}}").stdout.splitlines()[0]
    docker("node", "update", "--label-add", "codeyard.runner=true", json.loads(node)["ID"])
    deployed = docker("stack", "deploy", "-c", "docker-compose.yml", "-c", "docker/swarm.yml", STACK, check=False)
    assert deployed.returncode == 0, deployed.stderr[-3000:]
    try:
        # Both replicas, not just the proxy: swarm ignores depends_on, so a replica that started before PostgreSQL
        # exits and comes back, and a test begun meanwhile would meet it half-way
        stack_answering(300)
        yield
    finally:
        services = docker("stack", "ps", STACK, "--no-trunc", "--format", "{{.Name}} {{.CurrentState}} {{.Error}}",
                          check=False)
        logs = [docker("service", "logs", "--no-task-ids", "--timestamps", "--tail", "80", f"{STACK}_{service}", check=False)
                for service in ("proxy", "app1", "app2", "runner1")]  # why a task was replaced, if one was
        (REPO / "test-artifacts").mkdir(exist_ok=True)
        (REPO / "test-artifacts" / "swarm.log").write_text(services.stdout + services.stderr
                                                           + "".join(log.stdout + log.stderr for log in logs))
        docker("stack", "rm", STACK, check=False)
        workers = docker("ps", "-aq", "--filter", "label=codeyard.runner.worker", check=False).stdout.split()
        if workers:  # a launcher killed before its worker stopped leaves it behind
            docker("rm", "-f", *workers, check=False)
        if made:
            docker("swarm", "leave", "--force", check=False)


def test_the_swarm_stack_passes_the_smoke_part(swarm):
    alice = User()
    pid = alice.project({"main.py": "print('on a runner')\n"})
    assert alice.on(1).http.put(f"/api/projects/{pid}/files/content/a.txt", content=b"one").status_code in (200, 201)
    assert alice.on(2).http.get(f"/api/projects/{pid}/files/content/a.txt").text == "one"
    run = alice.finished(alice.run(pid))
    assert run["verdict"] == "ok" and run["stdout"] == "on a runner\n", run
    # Each global runner service's task is named after its node (docker/swarm.yml): unique when nodes are added. Waited
    # for: the run above needs only one, and at load 13-16 swarm stopped both runners' tasks (drained) 7 s after they
    # were ready and started them again, so one's heartbeat was missing when asked
    node = docker("node", "ls", "--format", "{{.Hostname}}").stdout.split()[0]

    def both_named() -> bool:
        assert sorted(app_hosts()) == [f"{node}-runner1", f"{node}-runner2"], app_hosts()
        return True

    eventually(both_named, 60, "both runners heartbeating under their node's name")
