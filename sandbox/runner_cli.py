"""`codeyard runner`: run as a runner node (sandbox.runner) until SIGTERM or SIGINT, then drain."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Annotated

import typer

app = typer.Typer(help="Run sandbox runs dispatched by the IDE replicas through Redis.")


@app.callback(invoke_without_command=True)
def runner_command(
    slots: Annotated[int, typer.Option(min=1, max=256, help="Runs at once on this node.")] = 4,
    name: Annotated[str | None, typer.Option(
        envvar="CODEYARD_RUNNER_NAME",
        help="This node's name in heartbeats, unique among the runners (default: host-pid). A swarm service sets it per "
             "node (docker/swarm.yml).")] = None,
    drain_seconds: Annotated[float, typer.Option(min=0, help="On shutdown, how long running runs may take to end.")] = 600,
    check: Annotated[bool, typer.Option(help="Only say whether Redis answers and a sandbox backend works here.")] = False,
    list_: Annotated[bool, typer.Option("--list", help="Only list the live runners and their capacity.")] = False,
    apps_host: Annotated[str | None, typer.Option(
        help="The address deployed apps hosted here are reached on by the replicas (default: this host's own "
             "address); 'none': host no apps.")] = None,
    in_worker: Annotated[bool, typer.Option(
        "--in-worker", help="Run in a container of its own, started through this node's Docker engine with the security "
                            "options bubblewrap needs (for swarm services, which cannot take them).")] = False,
) -> None:
    """Execute runs from the Redis runs stream on this machine's sandbox (CODEYARD_SANDBOX_BACKEND; Redis at
    CODEYARD_REDIS_URL; the data folder CODEYARD_DATA_DIR shared with the replicas)."""
    from redis.exceptions import RedisError

    from ide_server.leases import connect
    from ide_server.settings import Settings
    from sandbox.backends.choice import make_backend
    from sandbox.errors import SandboxUnavailable
    from sandbox.runner import Runner, live_runners, own_address

    if in_worker:
        _in_worker(slots, name, drain_seconds)
        return
    settings = Settings()
    redis_url = settings.redis_url
    if not redis_url:
        typer.echo("error: a runner needs CODEYARD_REDIS_URL (the replicas' Redis)", err=True)
        raise typer.Exit(2)
    if settings.sandbox_backend == "runners":
        typer.echo("error: a runner runs code itself: set CODEYARD_SANDBOX_BACKEND to auto, docker or bwrap", err=True)
        raise typer.Exit(2)
    try:
        backend = make_backend(settings.sandbox_backend)
    except SandboxUnavailable as exc:
        typer.echo(f"error: {exc.detail}", err=True)
        raise typer.Exit(2) from None
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def main() -> None:
        redis = connect(redis_url, 2 * slots + 8)  # per run: its input reader and its output
        try:
            try:
                await redis.ping()
            except RedisError as exc:
                typer.echo(f"error: Redis at {settings.redis_url} does not answer: {exc}", err=True)
                raise typer.Exit(2) from None
            if check:
                typer.echo(f"ok: Redis answers, sandbox backend {backend.name}")
                return
            if list_:
                for beat in await live_runners(redis):
                    apps = f", {beat['apps']} apps on {beat['apps_host']}" if "apps_host" in beat else ""
                    typer.echo(f"{beat['name']}: {beat['busy']}/{beat['slots']} slots busy, {beat['cpus']} CPUs, "
                               f"{int(beat['memory_bytes']) >> 20} MiB{apps}{', draining' if beat['draining'] == '1' else ''}")
                return
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop.set)
            try:
                hosts_apps = None if apps_host == "none" else apps_host or own_address("0.0.0.0")
            except OSError as exc:
                typer.echo(f"error: this host's own address is unknown ({exc}): give one with --apps-host", err=True)
                raise typer.Exit(2) from None
            runner = Runner(redis, backend, (settings.data_dir, settings.effective_packages_dir), slots=slots, name=name,
                            apps_host=hosts_apps)
            await runner.serve(stop, drain_seconds)
        finally:
            await redis.aclose()

    with asyncio.Runner(loop_factory=event_loop) as loop_runner:
        loop_runner.run(main())


def event_loop() -> asyncio.AbstractEventLoop:
    """uvloop, as uvicorn gives the IDE server: a hosted app's relay and the runner's Redis traffic take less of the
    node's CPU than on asyncio's own loop (the sandbox's process plumbing already runs on both)."""
    import uvloop

    return uvloop.new_event_loop()


def _in_worker(slots: int, name: str | None, drain_seconds: float) -> None:
    import socket

    from sandbox.backends.dockerd import docker_client
    from sandbox.runner_container import run_worker

    client = docker_client()
    if client is None:
        typer.echo("error: --in-worker needs this node's Docker engine (mount /var/run/docker.sock)", err=True)
        raise typer.Exit(2)
    name = name or socket.gethostname()
    command = ["codeyard", "runner", "--slots", str(slots), "--name", name, "--drain-seconds", str(drain_seconds)]
    raise typer.Exit(run_worker(client, command, name, stop_seconds=drain_seconds + 10))
