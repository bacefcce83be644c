"""A runner in a container of its own, started through the node's Docker engine (`codeyard runner --in-worker`).

For Docker Swarm: `docker stack deploy` ignores security_opt, and Docker's default seccomp profile refuses
pivot_root, which bubblewrap calls for every run. So on swarm the runner service only launches: through the
engine's socket it starts the worker, a plain container of the same image with this container's mounts and
environment, the host network, the capabilities bubblewrap needs and seccomp and AppArmor unconfined (what
docker-compose.yml gives its runners), and follows its logs. SIGTERM stops the worker, which drains; a
launcher that starts again first removes the worker a previous one left behind.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
from typing import Any

DockerClient = Any  # docker.DockerClient: the library ships no types
DOCKER_SOCKET = "/var/run/docker.sock"
WORKER_LABEL = "codeyard.runner.worker"
CAPABILITIES = ["SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE"]
SECURITY = ["seccomp=unconfined", "apparmor=unconfined"]


def worker_config(own: dict[str, Any], command: list[str], name: str) -> dict[str, Any]:
    """containers.create() keywords for the worker: this container's image, environment and mounts (but the
    engine's socket), with the security options a swarm service cannot take."""
    import docker.types

    mounts = [docker.types.Mount(m["Destination"], m.get("Name") or m["Source"], type=m["Type"], read_only=not m["RW"])
              for m in own["Mounts"] if m["Destination"] != DOCKER_SOCKET]
    return dict(image=own["Image"], command=command, name=f"codeyard-runner-{name}", environment=own["Config"]["Env"],
                mounts=mounts, network_mode="host", cap_add=CAPABILITIES, security_opt=SECURITY,
                labels={WORKER_LABEL: name}, init=True, detach=True)  # init: see docker-compose.yml's runners


def own_container_id() -> str:
    """This container's id, from the engine's files mounted into it (/etc/hostname...): on the host network its
    hostname is the host's, not the id."""
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            if found := re.search(r"/containers/([0-9a-f]{64})/(?:hostname|hosts|resolv\.conf) ", line):
                return found.group(1)
    raise RuntimeError("--in-worker runs inside a Docker container (none found in /proc/self/mountinfo)")


def run_worker(client: DockerClient, command: list[str], name: str, stop_seconds: float) -> int:
    """Start the worker, print its output until it ends, stop it on SIGTERM/SIGINT; returns its exit code."""
    import docker.errors

    own = client.api.inspect_container(own_container_id())
    for stale in client.containers.list(all=True, filters={"label": f"{WORKER_LABEL}={name}"}):
        stale.remove(force=True)
    worker = client.containers.create(**worker_config(own, command, name))

    def stop(_signum: int, _frame: object) -> None:
        threading.Thread(target=worker.stop, kwargs={"timeout": int(stop_seconds)}, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    worker.start()
    try:
        for chunk in worker.logs(stream=True, follow=True):
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        code: int = worker.wait()["StatusCode"]
        return code
    finally:
        try:
            worker.remove(force=True)
        except docker.errors.DockerException:
            pass
