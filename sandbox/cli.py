"""`codeyard sandbox ...`: build the runner image, check which backend would run code, run a file."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(help="Manage the code sandboxes.", no_args_is_help=True)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@app.command("build-image")
def build_image_command(
    base_image: Annotated[str | None, typer.Option(help="Pull and use this image instead of debootstrap.")] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if the image exists.")] = False,
) -> None:
    """Build the Docker runner image locally (debootstrap + docker import; no registry needed)."""
    import time

    from sandbox.backends.dockerd import docker_client
    from sandbox.image import ImageBuildError, build_image

    client = docker_client(timeout=600)
    if client is None:
        _fail("no Docker engine answers (start dockerd, or set DOCKER_HOST)")
    began = time.monotonic()
    try:
        build_image(client, lambda line: typer.echo(f"[{time.monotonic() - began:6.1f}s] {line}"), base_image=base_image, force=force)
    except ImageBuildError as exc:
        _fail(str(exc))


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
