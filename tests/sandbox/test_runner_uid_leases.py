"""A runner's runs beside the machine's other sandboxes. Every sandbox here runs code as uids leased machine-wide
(sandbox.host_lease), and any of them kills what runs as a uid it can lease: a server's start-up sweep, each run's
own start. A runner in a container has a /run of its own, so its leases were invisible to the host, which sees the
container's processes: a server or test starting on the host killed the stack's runs (SIGKILL, `runtime_error`
after the run's first output: the flake of `make test-stack`). docker-compose.yml now mounts the host's lease
folder into the runners; here a runner in a mount namespace with a /run of its own stands for the container."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
from pathlib import Path

import pytest
import yaml
from test_runner_nodes import data_dir, redis_server, redis_url, remote, runners, spec  # noqa: F401 (fixtures)

from sandbox.host_lease import UID_LEASES_DIR, lease_uid
from sandbox.verdict import Verdict
from sandbox.workspace import UID_BASE, UID_COUNT, kill_uid, processes_by_uid

REPO = Path(__file__).resolve().parents[2]
# A /run of its own, as a container has; with `shared`, the host's lease folder bound into it, as compose does.
OWN_RUN = 'mount -t tmpfs codeyard-run /run && exec "$@"'
SHARED_LEASES = (f'mount --bind {UID_LEASES_DIR} "$HOLD" && mount -t tmpfs codeyard-run /run && mkdir -m 700 {UID_LEASES_DIR} '
                 f'&& mount --move "$HOLD" {UID_LEASES_DIR} && exec "$@"')


def uid_running(marker: str) -> int:
    """The sandbox uid whose process has `marker` on its command line."""
    for uid, pids in processes_by_uid(range(UID_BASE, UID_BASE + UID_COUNT)).items():
        for pid in pids:
            try:
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return uid
            except OSError:
                continue
    raise AssertionError(f"no sandbox process runs {marker}")


@pytest.mark.skipif(not str(UID_LEASES_DIR).startswith("/run/") or shutil.which("unshare") is None,
                    reason="needs root (the leases in /run) and unshare")
@pytest.mark.parametrize("leases", ["own", "shared"])
async def test_a_runners_run_survives_the_machines_other_sandboxes_only_with_the_hosts_leases(runners, remote, data_dir,  # noqa: F811
                                                                                                leases, tmp_path):
    hold = tmp_path / "leases"
    hold.mkdir()
    script = OWN_RUN if leases == "own" else SHARED_LEASES
    runners.start("r", slots=1, prefix=("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"),
                  HOLD=str(hold))
    marker = f"run-{secrets.token_hex(4)}"
    run = await remote.start(spec(data_dir, "python3", "-c", f"import time; print('go', flush=True); time.sleep(1.5); print('done')  # {marker}"))
    assert (await anext(run.chunks())).data.startswith(b"go")  # it runs (print's newline may come as a chunk of its own)
    uid = uid_running(marker)
    if (fd := lease_uid(uid)) is not None:  # what a server starting on the host does with a uid nobody holds
        try:
            kill_uid(uid)
        finally:
            os.close(fd)
    result = await run.result()
    if leases == "own":  # the stack's flake, reproduced
        assert (result.verdict, result.signal) == (Verdict.RUNTIME_ERROR, signal.SIGKILL), result
    else:
        assert result.verdict is Verdict.OK and result.stdout == b"go\ndone\n", result


def test_the_stacks_runners_share_the_hosts_uid_leases():
    mount = f"/run/{UID_LEASES_DIR.name}:/run/{UID_LEASES_DIR.name}"
    for path in ("docker-compose.yml", "docker/swarm.yml"):  # (the swarm launcher gives its worker its own mounts)
        services = yaml.safe_load((REPO / path).read_text())["services"]
        for name in ("runner1", "runner2"):
            assert mount in services[name]["volumes"], (path, name)
