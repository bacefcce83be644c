"""`codeyard sandbox ...`: build the runner image, check which backend would run code, run a file."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated

import typer

app = typer.Typer(help="Manage the code sandboxes.", no_args_is_help=True)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _timed_echo() -> Callable[[str], None]:
    """Progress lines stamped with the seconds since this call (image builds take minutes)."""
    began = time.monotonic()
    return lambda line: typer.echo(f"[{time.monotonic() - began:6.1f}s] {line}")


@app.command("build-image")
def build_image_command(
    base_image: Annotated[str | None, typer.Option(help="Pull and use this image instead of debootstrap.")] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if the image exists.")] = False,
) -> None:
    """Build the Docker runner image locally (debootstrap + docker import; no registry needed)."""
    from sandbox.backends.dockerd import docker_client
    from sandbox.image import ImageBuildError, build_image

    client = docker_client(timeout=600)
    if client is None:
        _fail("no Docker engine answers (start dockerd, or set DOCKER_HOST)")
    try:
        build_image(client, _timed_echo(), base_image=base_image, force=force)
    except ImageBuildError as exc:
        _fail(str(exc))


@app.command("rootfs")
def rootfs_command() -> None:
    """Make the runner image's Debian rootfs (debootstrap, cached) without a Docker engine, so that a later
    build-image only imports it; a build already under way is waited for."""
    from sandbox.image import ImageBuildError, rootfs_tarball

    try:
        tarball = rootfs_tarball(_timed_echo())
    except ImageBuildError as exc:
        _fail(str(exc))
    typer.echo(str(tarball))


@app.command("check")
def check_command(backend: Annotated[str, typer.Option(help="auto, docker or bwrap")] = "auto") -> None:
    """Say which backend would run code here, or why none can."""
    from sandbox.backends.choice import make_backend
    from sandbox.errors import SandboxUnavailable

    try:
        typer.echo(make_backend(backend).name)
    except (SandboxUnavailable, ValueError) as exc:
        _fail(str(exc))


@app.command("cleanup")
def cleanup_command() -> None:
    """Remove what crashed runs left behind (run it while the server is stopped)."""
    from sandbox.backends.dockerd import docker_client
    from sandbox.sweep import sweep

    removed = sweep(docker_client(timeout=10))
    for line in removed:
        typer.echo(f"removed {line}")
    typer.echo(f"{len(removed)} leftovers removed")
