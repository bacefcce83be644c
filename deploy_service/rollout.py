"""ReleasePipeline: from a project's files to a release serving traffic.

A deploy snapshots the project into its release folder; then, in the background, the pipeline
detects how to run it, installs its packages (cached environments, as runs do), runs its build in
the sandbox, starts its instances and waits for each health check. Only then the route switches;
the old instances drain and stop. A release that fails never gets traffic, and why (with the log
tail) is kept on the release.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from sqlalchemy.orm import Session

from deploy_service.detect import AppPlan, detect
from deploy_service.instance import APP_LIMITS, Launch
from deploy_service.rules import DeployFailed, DeployRules
from deploy_service.supervisor import AppSupervisor, LiveApp
from ide_server.errors import DomainError, InvalidInput
from ide_server.services import projects
from sandbox import (
    MIB,
    Backend,
    Installer,
    InstallFailed,
    Limits,
    Mount,
    RunSpec,
    Verdict,
    WorkspaceTooLarge,
    copy_in,
    prepare_node,
    resolve_python,
    unknown_message,
)

log = logging.getLogger(__name__)

SNAPSHOT_BYTES, SNAPSHOT_FILES = 128 * MIB, 5000
BUILD_LIMITS = Limits(cpu_seconds=120, wall_seconds=300, memory_bytes=1024 * MIB, pids=128, output_bytes=4 * MIB,
                      file_bytes=64 * MIB, open_files=1024, disk_bytes=SNAPSHOT_BYTES, files_count=SNAPSHOT_FILES)


class ReleasePipeline:
    def __init__(self, *, rules: DeployRules, supervisor: AppSupervisor, projects_dir: Path, backend: Backend | None,
                 installer: Installer | None, secrets_of: Callable[[Session, str], dict[str, str]] | None) -> None:
        self.rules, self.supervisor, self.projects_dir = rules, supervisor, projects_dir
        self.backend, self.installer, self.secrets_of = backend, installer, secrets_of

    async def snapshot(self, app: LiveApp, project_id: str, release_id: str) -> None:
        """Copy the project's files into the release's folder (InvalidInput when it is too large to deploy)."""
        release_dir = self.supervisor.release_dir(app.deployment_id, release_id)
        try:
            release_dir.mkdir(parents=True)
            await asyncio.to_thread(copy_in, projects.project_dir(self.projects_dir, project_id), release_dir,
                                    max_bytes=SNAPSHOT_BYTES, max_files=SNAPSHOT_FILES, owner=None)
        except WorkspaceTooLarge as exc:
            await self._fail(app, release_id, f"the project is too large to deploy: {exc}", was_live=False)
            shutil.rmtree(release_dir, ignore_errors=True)
            raise InvalidInput(f"project: too large to deploy ({exc})") from None

    def start(self, app: LiveApp, release_id: str, *, build: bool) -> None:
        """Roll the release out in the background."""
        self.supervisor.spawn(self.roll_out(app, release_id, build=build))

    async def roll_out(self, app: LiveApp, release_id: str, *, build: bool) -> None:
        async with app.lock:
            if (state := await asyncio.to_thread(self.rules.rollout_start, app.deployment_id, release_id)) is None:
                return  # deleted meanwhile
            was_live, desired = state
            try:
                plan, launch = await self._prepare(app, release_id, build=build)
                if plan.instances is not None and build:
                    desired = plan.instances
                await asyncio.to_thread(
                    self.rules.set_release, release_id, status="starting", kind=plan.kind,
                    plan={"argv": plan.argv, "build": plan.build, "health": plan.health_path})
                app.log.write("system", f"starting {desired} instance(s): {' '.join(plan.argv)}\n", release_id)
                began = time.monotonic()
                fresh = await self.supervisor.start_instances(app, launch, desired, release_id)
            except DeployFailed as exc:
                await self._fail(app, release_id, str(exc), was_live)
                return
            except Exception as exc:  # a bug or the host: still a clear failure, never a stuck "building"
                log.exception("deploying release %s failed", release_id)
                await self._fail(app, release_id, f"internal error: {exc}", was_live)
                return
            previous = app.release_id
            old = self.supervisor.serve(app, fresh, launch, release_id, desired)  # the switch: new requests go here
            number = await asyncio.to_thread(self.rules.went_live, app.deployment_id, release_id, desired)
            if number is not None:
                app.log.write("system", f"release {number} is live{' (was ' + previous + ')' if previous else ''}\n",
                              release_id)
            app.log.write("system", f"live after {time.monotonic() - began:.1f} s of start-up; "
                                    f"{len(old)} old instance(s) draining\n", release_id)
            for gone in await asyncio.to_thread(self.rules.prune, app.deployment_id):
                shutil.rmtree(self.supervisor.release_dir(app.deployment_id, gone), ignore_errors=True)
        await self.supervisor.retire(app, old, "")  # outside the lock: a long request or WebSocket holds up nothing else

    async def _prepare(self, app: LiveApp, release_id: str, *, build: bool) -> tuple[AppPlan, Launch]:
        """Detect how to run the release, install its packages, run its build: the Launch of its instances."""
        release_dir = self.supervisor.release_dir(app.deployment_id, release_id)
        if not release_dir.is_dir():
            raise DeployFailed("the release's files are gone (it is older than the releases kept for rollback)")
        try:
            plan = await asyncio.to_thread(detect, release_dir)
        except ValueError as exc:
            raise DeployFailed(str(exc)) from None

        def progress(text: str) -> None:
            app.log.write("build", text, release_id)

        mounts, env = await self._packages(plan, release_dir, progress)
        env = {**await asyncio.to_thread(self._secrets, app.project_id), **env}
        if plan.build and build:
            await self._build(app, release_id, plan.build, release_dir, env, mounts)
        limits = APP_LIMITS if plan.memory_mb is None else replace(APP_LIMITS, memory_bytes=plan.memory_mb * MIB)
        return plan, Launch(release_dir, plan.argv, env, mounts, plan.health_path, limits, plan.cpus)

    def _secrets(self, project_id: str) -> dict[str, str]:
        """The project's secrets (deploy_service.secrets), injected into its builds and instances only.
        Blocking: call it in a worker thread (like every database call of a rollout)."""
        if self.secrets_of is None:
            return {}
        try:
            with self.rules.sessions() as db:
                return self.secrets_of(db, project_id)
        except DomainError as exc:
            raise DeployFailed(exc.detail) from None

    async def _packages(self, plan: AppPlan, release_dir: Path,
                        progress: Callable[[str], None]) -> tuple[tuple[Mount, ...], dict[str, str]]:
        if plan.ecosystem is None:
            return (), {}
        try:
            if plan.ecosystem == "node":
                prepared = await prepare_node(self._installer(), release_dir, progress)
                return prepared.mounts, prepared.env
            resolution = await asyncio.to_thread(resolve_python, release_dir)
            if resolution.unknown:
                progress(unknown_message(resolution.unknown, release_dir.name) + "\n")
            have = {canonicalize_name(Requirement(r).name) for r in resolution.requirements}
            requirements = (*resolution.requirements, *(r for r in plan.extra_requirements if canonicalize_name(r) not in have))
            if not requirements:
                return (), {}
            environment = await self._installer().install(requirements, progress)
        except (ValueError, InstallFailed) as exc:
            raise DeployFailed(str(exc)) from None
        return (environment.mount(),), environment.env()

    def _installer(self) -> Installer:
        if self.installer is None:
            raise DeployFailed("package installs are off on this server (see its log), and this app needs packages")
        return self.installer

    async def _build(self, app: LiveApp, release_id: str, argv: list[str], release_dir: Path, env: dict[str, str],
                     mounts: tuple[Mount, ...]) -> None:
        """Run the build in the sandbox over the release folder (what it writes lands there)."""
        assert self.backend is not None
        app.log.write("system", f"build: {' '.join(argv)}\n", release_id)
        run = await self.backend.start(RunSpec(argv, release_dir, BUILD_LIMITS, env, mounts=mounts))
        await run.close_stdin()
        try:
            async for chunk in run.chunks():
                app.log.write("build", chunk.data.decode("utf-8", "replace"), release_id)
            result = await run.result()
        except asyncio.CancelledError:  # the server is stopping: the build stops too, and cleans up first
            run.cancel()
            await run.result()
            raise
        if result.verdict != Verdict.OK:
            how = result.message or (f"signal {result.signal}" if result.signal else f"exit code {result.exit_code}")
            raise DeployFailed(f"the build failed ({result.verdict.value}: {how})")

    async def _fail(self, app: LiveApp, release_id: str, message: str, was_live: bool) -> None:
        """Record why a release did not go live (what served before keeps serving); a new release's folder goes."""
        app.log.write("system", f"release failed, not switched: {message.splitlines()[0]}\n", release_id)
        await asyncio.to_thread(self.rules.failed, app.deployment_id, release_id, message, was_live)
        if not was_live:
            shutil.rmtree(self.supervisor.release_dir(app.deployment_id, release_id), ignore_errors=True)
