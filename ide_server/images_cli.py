"""`codeyard images build`: the app, runner, LLM, PostgreSQL and Redis images, built here without a registry."""

from __future__ import annotations

import time
from typing import Annotated

import typer

app = typer.Typer(help="Build the server's Docker images without a registry.", no_args_is_help=True)


@app.command("build")
def build_command(
    names: Annotated[list[str] | None, typer.Argument(help="app, runner, llm, postgres, redis, proxy (default: all)")] = None,
    base: Annotated[str | None, typer.Option(help="Build on this image (e.g. python:3.11-slim) instead of the local Debian base.")] = None,
) -> None:
    """Make the Debian base (debootstrap + docker import) unless --base names one, then build the images on it."""
    from ide_server.images import build_images
    from sandbox.backends.dockerd import docker_client
    from sandbox.image import ImageBuildError

    client = docker_client(timeout=1800)
    if client is None:
        typer.echo("error: no Docker engine answers (start dockerd, or set DOCKER_HOST)", err=True)
        raise typer.Exit(2)
    began = time.monotonic()
    try:
        built = build_images(client, names or [], lambda line: typer.echo(f"[{time.monotonic() - began:6.1f}s] {line}"), base=base)
    except (ImageBuildError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    for name, image_id in built.items():
        typer.echo(f"{name}: {image_id}")


@app.command("list")
def list_command() -> None:
    """The images this command builds: names, tags and Dockerfiles."""
    from ide_server.images import describe

    typer.echo(describe())
