"""Build the Docker backend's runner image without an image registry.

The image is a Debian rootfs made by debootstrap (Debian's mirror is reachable where registries
are not), tarred once into a cache and imported with `docker import`. Where a base image can be
pulled (CODEYARD_SANDBOX_BASE_IMAGE), it is used instead.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

DockerClient = Any  # docker.DockerClient: the library ships no types

RUNNER_IMAGE = os.environ.get("CODEYARD_SANDBOX_IMAGE", "codeyard/runner:bookworm")
SUITE = "bookworm"
MIRROR = os.environ.get("CODEYARD_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PACKAGES = ("python3", "nodejs", "gcc", "g++", "libc6-dev", "bash", "ca-certificates")
PRUNED = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/cache/apt", "var/lib/apt/lists")
IMAGE_CHANGES = ["ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 HOME=/tmp", "WORKDIR /workspace"]
REQUIRED_TOOLS = ["/usr/bin/python3", "/usr/bin/node", "/usr/bin/gcc", "/usr/bin/g++", "/bin/bash"]

Progress = Callable[[str], None]


class ImageBuildError(RuntimeError):
    """The runner image could not be built; the message says which step failed."""


def cache_dir() -> Path:
    """Where the rootfs tarball and downloaded .debs are kept between builds."""
    data_dir = Path(os.environ.get("CODEYARD_DATA_DIR", ".codeyard"))
    path = Path(os.environ.get("CODEYARD_CACHE_DIR", data_dir / "cache")).absolute()  # debootstrap takes no other
    path.mkdir(parents=True, exist_ok=True)
    return path


def rootfs_path(packages: tuple[str, ...] = PACKAGES, name: str = "runner") -> Path:
    """Where the tarball of Debian with `packages` is cached: a new package list or mirror makes a new one."""
    key = hashlib.sha256(f"{SUITE} {MIRROR} {' '.join(packages)}".encode()).hexdigest()[:12]
    return cache_dir() / f"{name}-rootfs-{SUITE}-{key}.tar"


def rootfs_tarball(progress: Progress, packages: tuple[str, ...] = PACKAGES, name: str = "runner") -> Path:
    """The cached rootfs tarball of Debian with `packages`, made with debootstrap on the first call
    (the sandbox's runner image, and the base of the server images: `ide_server.images`). A second
    caller while one builds waits for that build instead of starting its own (`make test` starts the
    runner's beside its first tests)."""
    tarball = rootfs_path(packages, name)
    with open(tarball.with_suffix(".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for the rootfs that another process is making ({tarball.name})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if tarball.exists():
            progress(f"using cached rootfs {tarball}")
            return tarball
        _debootstrap(tarball, packages, progress)
    return tarball


def _debootstrap(tarball: Path, packages: tuple[str, ...], progress: Progress) -> None:
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is not installed (apt-get install debootstrap)")
    work = Path(tempfile.mkdtemp(prefix="rootfs-", dir=cache_dir()))
    try:
        rootfs = work / "rootfs"
        argv = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}",
                f"--cache-dir={cache_dir() / 'debs'}", SUITE, str(rootfs), MIRROR]
        (cache_dir() / "debs").mkdir(exist_ok=True)
        progress(f"debootstrap {SUITE} with {', '.join(packages)} (a few minutes)")
        _run_with_progress(argv, progress)
        for rel in PRUNED:
            shutil.rmtree(rootfs / rel, ignore_errors=True)
        (rootfs / "workspace").mkdir(exist_ok=True)
        progress("packing the rootfs")
        partial = tarball.with_suffix(".partial")
        _run_with_progress(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."], progress)
        partial.rename(tarball)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_with_progress(argv: list[str], progress: Progress) -> None:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-20:]
        if line.startswith(("I: Retrieving", "I: Validating", "I: Unpacking", "I: Configuring", "I: Installing", "I: Base system")):
            progress(line[3:])
    if proc.wait() != 0:
        raise ImageBuildError(f"{argv[0]} failed (exit {proc.returncode}):\n" + "\n".join(tail))


def _try_base_image(client: DockerClient, base: str, progress: Progress) -> bool:
    import docker.errors

    progress(f"pulling base image {base}")
    try:
        image = client.images.pull(base)
    except docker.errors.DockerException as exc:
        progress(f"cannot pull {base} ({exc.__class__.__name__}); building from Debian packages instead")
        return False
    repo, _, tag = RUNNER_IMAGE.rpartition(":")
    image.tag(repo, tag)
    return True


def build_image(client: DockerClient, progress: Progress, *, base_image: str | None = None,
                force: bool = False) -> str:
    """Make RUNNER_IMAGE available in the engine behind `client`; returns the image id."""
    import docker.errors

    if not force:
        try:
            found: str = client.images.get(RUNNER_IMAGE).id
            return found
        except docker.errors.ImageNotFound:
            pass
    base_image = base_image or os.environ.get("CODEYARD_SANDBOX_BASE_IMAGE")
    if not (base_image and _try_base_image(client, base_image, progress)):
        tarball = rootfs_tarball(progress)
        repo, _, tag = RUNNER_IMAGE.rpartition(":")
        progress(f"importing {tarball.stat().st_size // (1 << 20)} MiB into Docker as {RUNNER_IMAGE}")
        client.api.import_image_from_file(str(tarball), repository=repo, tag=tag, changes=IMAGE_CHANGES)
    progress("checking the image has python3, node, gcc, g++ and bash")
    check = ["/bin/sh", "-c", 'for t in "$@"; do test -x "$t" || { echo "missing $t"; exit 1; }; done', "sh", *REQUIRED_TOOLS]
    try:
        client.containers.run(RUNNER_IMAGE, check, remove=True, network_mode="none")
    except docker.errors.ContainerError as exc:
        raise ImageBuildError(f"the image {RUNNER_IMAGE} lacks a tool: {exc.stderr or exc}") from exc
    image_id: str = client.images.get(RUNNER_IMAGE).id
    progress(f"ready: {RUNNER_IMAGE} ({image_id[:19]})")
    return image_id
