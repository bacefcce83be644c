"""Sandbox fixtures shared by tests/sandbox and tests/sandbox_api (each conftest star-imports them):
both backends for real (a dockerd of our own if no engine answers, the runner image built on the
spot), and a check after every test that the run left nothing behind."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SERVICES = REPO / ".services" / "docker"

# Every run's workspace mount lives under this session's own folder, so the leftover check is exact.
os.environ["CODEYARD_SANDBOX_DIR"] = tempfile.mkdtemp(prefix="codeyard-sandbox-test-")
os.environ.setdefault("CODEYARD_CACHE_DIR", str(REPO / ".codeyard" / "cache"))

from sandbox.backend import RunSpec  # noqa: E402
from sandbox.cgroups import RunCgroup, cgroup_dirs  # noqa: E402
from sandbox.host_lease import lease_uid  # noqa: E402
from sandbox.limits import Limits  # noqa: E402
from sandbox.workspace import UID_BASE, UID_COUNT, processes_by_uid  # noqa: E402


def _say(line: str) -> None:
    sys.__stderr__.write(f"[sandbox fixtures] {line}\n")
    sys.__stderr__.flush()


@pytest.fixture(scope="session")
def docker_engine():
    """A Docker client: the engine that answers, or a dockerd this session starts and stops."""
    from sandbox.backends.dockerd import LocalDockerd, docker_client
    from sandbox.errors import SandboxUnavailable

    client = docker_client()
    if client is not None:
        yield client
        return
    dockerd = LocalDockerd(SERVICES)
    try:
        client = dockerd.start()
    except SandboxUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    _say(f"started dockerd at {SERVICES}")
    yield client
    client.close()
    dockerd.stop()


@pytest.fixture(scope="session")
def runner_image(docker_engine) -> str:
    """The Docker runner image, built here (debootstrap + import) if the engine lacks it."""
    from sandbox.image import RUNNER_IMAGE, build_image

    began = time.monotonic()
    build_image(docker_engine, _say)
    _say(f"runner image ready in {time.monotonic() - began:.1f}s")
    return RUNNER_IMAGE


TEST_LIMITS = dict(cpu_seconds=3, wall_seconds=6, memory_bytes=128 << 20, pids=64, output_bytes=256 << 10)


@pytest.fixture(params=["bwrap", "docker", "docker-warm"])
async def backend(request):
    """Each backend; docker-warm is Docker with a warm pool sized for make_spec's default limits."""
    if request.param == "bwrap":
        from sandbox.backends.bwrap import BwrapBackend

        yield BwrapBackend()
        return
    from sandbox.backends.docker import DockerBackend

    request.getfixturevalue("runner_image")
    client = request.getfixturevalue("docker_engine")
    if request.param == "docker":
        yield DockerBackend(client)
        return
    backend = DockerBackend(client, pool_limits=Limits(**TEST_LIMITS), pool_size=2)
    await backend.warm_up()
    yield backend
    await backend.close()


@pytest.fixture
def project(tmp_path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


def make_spec(project: Path, argv: list[str], **limits) -> RunSpec:
    """A run with small, fast limits unless a test asks for others."""
    return RunSpec(argv, project, Limits(**{**TEST_LIMITS, **limits}))


def _leased_elsewhere(uid: int) -> bool:
    """Whether a live run (another test session's, a server's) holds uid: its processes are not ours."""
    if (lease := lease_uid(uid)) is None:
        return True
    os.close(lease)
    return False


def leftovers(client=None) -> list[str]:
    """Everything a run could leave behind: processes, containers, mounts, folders, cgroups."""
    found = []
    for uid, pids in processes_by_uid(range(UID_BASE, UID_BASE + UID_COUNT)).items():
        if not _leased_elsewhere(uid):
            found += [f"process {pid} of sandbox uid {uid}" for pid in pids]
    runs_root = os.environ["CODEYARD_SANDBOX_DIR"]
    found += [f"folder {p}" for p in os.listdir(runs_root)]
    found += [f"mount {line.split()[4]}" for line in Path("/proc/self/mountinfo").read_text().splitlines() if runs_root in line]
    base = RunCgroup.base_relpath()
    if base:
        for d in cgroup_dirs(base):
            found += [f"cgroup {p}" for p in d.iterdir() if p.is_dir()]
    if client is not None:
        from sandbox.backends.docker import LABEL, POOL_LABEL

        for label in (LABEL, POOL_LABEL):  # ours: made under our cgroup (another session's engine may be shared)
            found += [f"container {c.name}" for c in client.containers.list(all=True, filters={"label": label})
                      if base is None or (c.attrs["HostConfig"].get("CgroupParent") or "").startswith(base)]
    return found


@pytest.fixture(autouse=True)
def nothing_left_behind(request):
    """After each test: no process, container, mount, folder or cgroup of any run remains."""
    yield
    client = request.getfixturevalue("docker_engine") if "docker_engine" in request.fixturenames or (
        "backend" in request.fixturenames and getattr(request.node, "callspec", None) and request.node.callspec.params.get("backend", "").startswith("docker")
    ) else None
    deadline = time.monotonic() + 5  # cleanup runs as the run ends; a loaded host may take a moment
    while (found := leftovers(client)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not found, f"left behind: {found[:10]}"
