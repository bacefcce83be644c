"""DeployService: the rules of deploys, over the database (what should run) and the live apps (what runs).

A deploy snapshots the project at a fresh checkpoint into its release folder, then in the
background installs its packages (cached environments, as runs do), runs its build, starts its
instances and waits for each health check. Only then the route switches, in one assignment; the
old instances drain their in-flight requests and stop. A release that fails never gets traffic
and its failure (with the log tail) is kept on the release. One lock per deployment orders
deploys, rollbacks, scaling, stops and crash restarts.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from collab.editors import OpenEditors
from deploy_service.detect import MAX_INSTANCES, AppPlan, detect
from deploy_service.instance import APP_LIMITS, AppInstance, Launch
from deploy_service.logs import DeployLog
from deploy_service.models import Deployment, Release
from deploy_service.owner import Ownership, Replica
from deploy_service.proxy import Route, Routes
from deploy_service.schemas import DeploymentPublic, ReleasePublic
from ide_server.errors import Conflict, DomainError, InvalidInput, NotFound
from ide_server.models import Project, User
from ide_server.services import projects
from sandbox.backend import Backend, Mount, RunSpec
from sandbox.errors import SandboxUnavailable
from sandbox.files import WorkspaceTooLarge, copy_in
from sandbox.limits import MIB, Limits
from sandbox.packages.install import Installer, InstallFailed
from sandbox.packages.project import prepare_node, unknown_message
from sandbox.packages.resolve import resolve_python
from sandbox.verdict import Verdict

log = logging.getLogger(__name__)

SNAPSHOT_BYTES, SNAPSHOT_FILES = 128 * MIB, 5000
BUILD_LIMITS = Limits(cpu_seconds=120, wall_seconds=300, memory_bytes=1024 * MIB, pids=128, output_bytes=4 * MIB,
                      file_bytes=64 * MIB, open_files=1024, disk_bytes=SNAPSHOT_BYTES, files_count=SNAPSHOT_FILES)
HEALTH_TIMEOUT = 30.0
DRAIN_TIMEOUT = 30.0
ROLLBACK_RELEASES = 5  # successful releases kept (folders and all) for rollback
KEPT_RELEASE_ROWS = 30
BACKOFF_START, BACKOFF_MAX, STABLE_SECONDS = 0.5, 30.0, 60.0
RECONCILE_SECONDS = 5.0
MAX_PENDING_RELEASES = 3  # deploys of one project waiting their turn (a double click queues, a script can't pile up)
MAX_RUNNING_INSTANCES = 32  # on this server, all deployments together (each may use APP_LIMITS' memory)


class DeploymentNotFound(NotFound):
    pass


class DeployFailed(Exception):
    """A release could not go live; the message says why, with the tail of its log."""


def _now() -> datetime:
    return datetime.now(UTC)


def _slug_base(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:24].strip("-") or "app"


@dataclass
class LiveApp:
    """What runs for one deployment now (in this process)."""

    deployment_id: str
    project_id: str
    slug: str
    log: DeployLog
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    release_id: str | None = None  # the release serving (or meant to)
    launch: Launch | None = None
    instances: list[AppInstance] = field(default_factory=list)
    draining: list[AppInstance] = field(default_factory=list)  # out of the route, finishing their requests
    desired: int = 1
    stopped: bool = False
    restarts: int = 0


class DeployService:
    def __init__(self, *, sessions: sessionmaker, projects_dir: Path, root: Path, backend: Backend | None,
                 unavailable: str, installer: Installer | None, editors: OpenEditors,
                 secrets_of: Callable[[Session, str], dict[str, str]] | None, apps_host: str | None = None,
                 https: bool = False, max_instances: int = MAX_RUNNING_INSTANCES) -> None:
        self.sessions, self.projects_dir, self.root = sessions, projects_dir, root
        self.backend, self.unavailable, self.installer = backend, unavailable, installer
        self.editors, self.secrets_of = editors, secrets_of
        self.apps_host, self.https, self.max_instances = apps_host, https, max_instances
        self.routes = Routes()
        self.ownership = Ownership(Replica("lone", "", None), redis_url=None)  # a lone server runs the apps
        self._apps: dict[str, LiveApp] = {}
        self._tasks: set[asyncio.Task] = set()
        for name in ("releases", "logs"):
            (root / name).mkdir(parents=True, exist_ok=True)

    # ----- public operations (called by the API) -----

    async def deploy(self, user: User, project_id: str) -> DeploymentPublic:
        """Snapshot the project now and roll it out in the background (202: the release is "building")."""
        self._require_backend()
        await self.editors.checkpoint(project_id, "Checkpoint before a deploy")
        with self.sessions() as db, db.begin():
            deployment = db.scalar(select(Deployment).where(Deployment.project_id == project_id))
            if deployment is None:
                deployment = Deployment(id=secrets.token_hex(8), project_id=project_id, slug=self._new_slug(db, project_id),
                                        status="deploying", instances=1)
                db.add(deployment)
                db.flush()
            pending = db.scalar(select(func.count()).select_from(Release).where(
                Release.deployment_id == deployment.id, Release.status.in_(("building", "starting"))))
            if pending >= MAX_PENDING_RELEASES:
                raise Conflict(f"{pending} deploys of this project are already under way; wait for them to finish")
            number = (db.scalar(select(func.max(Release.number)).where(Release.deployment_id == deployment.id)) or 0) + 1
            release = Release(id=secrets.token_hex(8), deployment_id=deployment.id, number=number, status="building",
                              plan={}, message="", user_id=user.id)
            db.add(release)
            if deployment.current_release_id is None:
                deployment.status = "deploying"
            deployment_id, release_id = deployment.id, release.id
        app = self._live(deployment_id)
        app.log.write("system", f"release {number}: snapshot of the project taken, building\n", release_id)
        release_dir = self._release_dir(deployment_id, release_id)
        try:
            release_dir.mkdir(parents=True)
            await asyncio.to_thread(copy_in, projects.project_dir(self.projects_dir, project_id), release_dir,
                                    max_bytes=SNAPSHOT_BYTES, max_files=SNAPSHOT_FILES, owner=None)
        except WorkspaceTooLarge as exc:
            self._fail(app, release_id, f"the project is too large to deploy: {exc}", was_live=False)
            shutil.rmtree(release_dir, ignore_errors=True)
            raise InvalidInput(f"project: too large to deploy ({exc})") from None
        self._spawn(self._roll_out(app, release_id, build=True))
        return self.status(project_id)

    async def rollback(self, project_id: str, release_id: str) -> DeploymentPublic:
        """Bring back one of the last successful releases (202; it goes live once healthy)."""
        self._require_backend()
        with self.sessions() as db:
            deployment = self._deployment(db, project_id)
            release = db.get(Release, release_id)
            if release is None or release.deployment_id != deployment.id:
                raise InvalidInput(f"release_id: no release {release_id} in this deployment")
            if release.id not in self._rollback_ids(db, deployment):
                raise InvalidInput(f"release_id: release {release.number} cannot be rolled back to (only the last "
                                   f"{ROLLBACK_RELEASES} releases that went live, other than the current one)")
            number = release.number
        app = self._live(deployment.id)
        app.log.write("system", f"rolling back to release {number}\n", release_id)
        self._spawn(self._roll_out(app, release_id, build=False))
        return self.status(project_id)

    async def scale(self, project_id: str, instances: int) -> DeploymentPublic:
        """Run `instances` copies of the current release, round-robin (new ones serve once healthy)."""
        if not 1 <= instances <= MAX_INSTANCES:
            raise InvalidInput(f"instances: must be from 1 to {MAX_INSTANCES}")
        with self.sessions() as db:
            deployment_id = self._deployment(db, project_id).id
        app = self._live(deployment_id)
        async with app.lock:
            previous, app.desired = app.desired, instances
            try:
                if app.launch is not None and not app.stopped:
                    await self._resize(app)
            except Conflict:
                app.desired = previous
                raise
            with self.sessions() as db, db.begin():
                if (deployment := db.get(Deployment, deployment_id)) is not None:
                    deployment.instances = instances
        return self.status(project_id)

    async def stop(self, project_id: str) -> DeploymentPublic:
        """Stop serving (in-flight requests finish first); a new deploy starts it again."""
        with self.sessions() as db:
            deployment_id = self._deployment(db, project_id).id
        app = self._live(deployment_id)
        async with app.lock:
            app.stopped = True
            await self._retire(app, list(app.instances), "the app is stopped")
            app.instances = []
            self._set_status(app, "stopped")
            app.log.write("system", "stopped\n", app.release_id)
        return self.status(project_id)

    async def delete(self, project_id: str) -> None:
        """Stop the app and remove the deployment, its releases and logs."""
        with self.sessions() as db:
            deployment_id = self._deployment(db, project_id).id
        app = self._live(deployment_id)
        with self.sessions() as db, db.begin():
            if (row := db.get(Deployment, deployment_id)) is not None:
                db.delete(row)
        await self._remove(app)

    async def _remove(self, app: LiveApp) -> None:
        """Stop a deployment whose row is gone and remove its files (releases, logs)."""
        async with app.lock:
            app.stopped = True
            await self._retire(app, list(app.instances), "the app was deleted")
            app.instances, app.launch = [], None
            self.routes.drop(app.slug)
            shutil.rmtree(self.root / "releases" / app.deployment_id, ignore_errors=True)
            app.log.remove()
        self._apps.pop(app.deployment_id, None)

    async def reconcile_forever(self, every: float = RECONCILE_SECONDS) -> None:
        """Deleting a project deletes its deployment rows (cascade): stop such apps and drop their files."""
        while True:
            await asyncio.sleep(every)
            try:
                present = await asyncio.to_thread(self._deployment_ids)
                for app in [a for a in self._apps.values() if a.deployment_id not in present]:
                    await self._remove(app)
                for folder in (self.root / "releases").iterdir():
                    if folder.name not in present and folder.name not in self._apps:
                        shutil.rmtree(folder, ignore_errors=True)
            except Exception:
                log.exception("reconciling deployments failed")

    def _deployment_ids(self) -> set[str]:
        with self.sessions() as db:
            return set(db.scalars(select(Deployment.id)))

    def status(self, project_id: str) -> DeploymentPublic:
        with self.sessions() as db:
            deployment = self._deployment(db, project_id)
            rows = db.scalars(select(Release).where(Release.deployment_id == deployment.id)
                              .order_by(Release.number.desc()).limit(KEPT_RELEASE_ROWS)).all()
            can_roll_back = self._rollback_ids(db, deployment)
            releases = [ReleasePublic.model_validate(r).model_copy(update={"can_roll_back": r.id in can_roll_back})
                        for r in rows]
        app = self._apps.get(deployment.id)
        healthy = sum(1 for i in app.instances if not i.exited) if app else 0
        current = next((r for r in releases if r.id == deployment.current_release_id), None)
        return DeploymentPublic(slug=deployment.slug, url=self.url_of(deployment.slug), status=deployment.status,
                                instances=deployment.instances, healthy_instances=healthy, current_release=current,
                                releases=releases)

    def log_of(self, project_id: str) -> DeployLog:
        with self.sessions() as db:
            deployment = self._deployment(db, project_id)
        return self._live(deployment.id).log

    def url_of(self, slug: str) -> str:
        if self.apps_host:
            return f"{'https' if self.https else 'http'}://{slug}.apps.{self.apps_host}/"
        return f"/apps/{slug}/"

    # ----- start-up and shut-down -----

    async def restore(self) -> int:
        """After a server start: every deployment that was serving comes back with its release (and
        from then on, apps of deleted projects are stopped)."""
        self._spawn(self.reconcile_forever())
        with self.sessions() as db, db.begin():
            for release in db.scalars(select(Release).where(Release.status.in_(("building", "starting")))):
                release.status, release.finished_at = "failed", _now()
                release.message = "the server stopped while this release was being deployed"
            wanted = []
            for deployment in db.scalars(select(Deployment)):
                if deployment.current_release_id is None:
                    deployment.status = "failed" if deployment.status == "deploying" else deployment.status
                elif deployment.status in ("running", "unhealthy", "deploying"):
                    wanted.append((deployment.id, deployment.current_release_id))
                elif deployment.status == "stopped":
                    self.routes.set(deployment.slug, Route((), "the app is stopped"))
        if wanted and self.backend is None:
            log.warning("%d deployments cannot come back: %s", len(wanted), self.unavailable)
            return 0
        for deployment_id, release_id in wanted:
            app = self._live(deployment_id)
            app.log.write("system", "the server restarted: starting the current release again\n", release_id)
            self._spawn(self._roll_out(app, release_id, build=False))
        return len(wanted)

    async def shutdown(self) -> None:
        """Stop every instance (the database still says what should run, for the next start, or for
        the replica that runs the apps after this one)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for app in self._apps.values():
            for instance in [*app.instances, *app.draining]:
                await instance.stop()
            app.instances, app.draining = [], []
            app.log.close()
        self._apps.clear()
        self.routes.clear()

    # ----- rolling out a release -----

    async def _roll_out(self, app: LiveApp, release_id: str, *, build: bool) -> None:
        async with app.lock:
            with self.sessions() as db:
                release = db.get(Release, release_id)
                deployment = db.get(Deployment, app.deployment_id)
                if release is None or deployment is None:
                    return  # deleted meanwhile
                was_live, desired = release.live_at is not None, deployment.instances
            try:
                plan, launch = await self._prepare(app, release_id, build=build)
                if plan.instances is not None and build:
                    desired = plan.instances
                self._set_release(release_id, status="starting", kind=plan.kind,
                                  plan={"argv": plan.argv, "build": plan.build, "health": plan.health_path})
                app.log.write("system", f"starting {desired} instance(s): {' '.join(plan.argv)}\n", release_id)
                began = time.monotonic()
                fresh = await self._start_instances(app, launch, desired, release_id)
            except DeployFailed as exc:
                self._fail(app, release_id, str(exc), was_live)
                return
            except Exception as exc:  # a bug or the host: still a clear failure, never a stuck "building"
                log.exception("deploying release %s failed", release_id)
                self._fail(app, release_id, f"internal error: {exc}", was_live)
                return
            old, previous = app.instances, app.release_id
            app.instances, app.launch, app.release_id, app.desired = fresh, launch, release_id, desired
            app.stopped, app.restarts = False, 0
            self._publish(app)  # the switch: one assignment, new requests go to the new release
            for instance in old:
                instance.stopping = True  # from now on its exit is no crash
            for instance in fresh:
                self._watch(app, instance, release_id)
            self._went_live(app, release_id, previous, desired)
            app.log.write("system", f"live after {time.monotonic() - began:.1f} s of start-up; "
                                    f"{len(old)} old instance(s) draining\n", release_id)
            self._prune(app)
        await self._retire(app, old, "")  # outside the lock: a long request or WebSocket holds up nothing else

    async def _prepare(self, app: LiveApp, release_id: str, *, build: bool) -> tuple[AppPlan, Launch]:
        """Detect how to run the release, install its packages, run its build: the Launch of its instances."""
        release_dir = self._release_dir(app.deployment_id, release_id)
        if not release_dir.is_dir():
            raise DeployFailed("the release's files are gone (it is older than the releases kept for rollback)")
        try:
            plan = await asyncio.to_thread(detect, release_dir)
        except ValueError as exc:
            raise DeployFailed(str(exc)) from None

        def progress(text: str) -> None:
            app.log.write("build", text, release_id)

        mounts, env = await self._packages(plan, release_dir, progress)
        with self.sessions() as db:
            env = {**self._secrets(db, app.project_id), **env}
        if plan.build and build:
            await self._build(app, release_id, plan.build, release_dir, env, mounts)
        limits = APP_LIMITS if plan.memory_mb is None else replace(APP_LIMITS, memory_bytes=plan.memory_mb * MIB)
        return plan, Launch(release_dir, plan.argv, env, mounts, plan.health_path, limits, plan.cpus)

    def _secrets(self, db: Session, project_id: str) -> dict[str, str]:
        """The project's secrets (deploy_service.secrets), injected into its builds and instances only."""
        if self.secrets_of is None:
            return {}
        try:
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

    async def _start_instances(self, app: LiveApp, launch: Launch, count: int, release_id: str) -> list[AppInstance]:
        """`count` healthy instances, or DeployFailed (and none left running)."""

        def sink(stream: str, line: str) -> None:
            app.log.write(stream, line, release_id)

        running = sum(len(a.instances) + len(a.draining) for a in self._apps.values())
        if running + count > self.max_instances:
            raise DeployFailed(f"the server already runs {running} app instances, its maximum is {self.max_instances}: "
                               "stop an app (or scale one down) first")
        instances = [AppInstance(self.backend, launch, sink) for _ in range(count)]
        try:
            await asyncio.gather(*(i.start() for i in instances))
            reasons = await asyncio.gather(*(i.wait_healthy(HEALTH_TIMEOUT) for i in instances))
        except SandboxUnavailable as exc:
            reasons = [exc.detail]
        except BaseException:
            await asyncio.gather(*(i.stop() for i in instances), return_exceptions=True)
            raise
        failed = next((r for r in reasons if r), None)
        if failed:
            await asyncio.gather(*(i.stop() for i in instances), return_exceptions=True)
            await asyncio.sleep(0)  # let the pipes deliver the last output
            tail = app.log.text(release_id).strip()
            raise DeployFailed(f"{failed}" + (f"\n--- log ---\n{tail}" if tail else ""))
        return instances

    async def _retire(self, app: LiveApp, instances: list[AppInstance], reason: str) -> None:
        """Take instances out of the route, let their requests finish, then stop them."""
        for instance in instances:
            instance.stopping = True
        if instances:
            kept = [i for i in app.instances if i not in instances]
            self.routes.set(app.slug, Route(tuple(kept), reason))
        app.draining += instances
        try:
            await asyncio.gather(*(i.drain(DRAIN_TIMEOUT) for i in instances))
        finally:
            await asyncio.gather(*(i.stop() for i in instances), return_exceptions=True)
            app.draining = [i for i in app.draining if i not in instances]

    async def _resize(self, app: LiveApp) -> None:
        assert app.launch is not None and app.release_id is not None
        extra = app.desired - len(app.instances)
        if extra > 0:
            try:
                fresh = await self._start_instances(app, app.launch, extra, app.release_id)
            except DeployFailed as exc:
                app.log.write("system", f"scaling up failed: {exc}\n", app.release_id)
                raise Conflict(f"scaling up failed: {str(exc).splitlines()[0]}") from None
            app.instances += fresh
            for instance in fresh:
                self._watch(app, instance, app.release_id)
            self._publish(app)
        elif extra < 0:
            surplus = app.instances[extra:]
            app.instances = app.instances[:extra]
            self._publish(app)
            await self._retire(app, surplus, "")
        app.log.write("system", f"scaled to {app.desired} instance(s)\n", app.release_id)
        self._set_status(app, "running")

    # ----- crashes -----

    def _watch(self, app: LiveApp, instance: AppInstance, release_id: str) -> None:
        self._spawn(self._supervise(app, instance, release_id))

    async def _supervise(self, app: LiveApp, instance: AppInstance, release_id: str) -> None:
        """When an instance dies on its own: unhealthy, restart it with backoff until one is healthy again."""
        status = await instance.wait_exit()
        if instance.stopping or instance not in app.instances:
            return
        if time.monotonic() - instance.started_at > STABLE_SECONDS:
            app.restarts = 0
        how = f"signal {status.signal}" if status.signal else f"exit code {status.exit_code}"
        async with app.lock:
            if instance not in app.instances:
                return  # retired meanwhile
            app.instances.remove(instance)
            self._publish(app, "restarting after a crash")
            self._set_status(app, "unhealthy")
        await instance.stop()
        while True:
            delay = min(BACKOFF_START * 2 ** app.restarts, BACKOFF_MAX)
            app.restarts += 1
            app.log.write("system", f"an instance exited ({how}); unhealthy, restarting in {delay:.1f} s\n", release_id)
            await asyncio.sleep(delay)
            async with app.lock:
                if app.stopped or app.release_id != release_id or app.launch is None or len(app.instances) >= app.desired:
                    return  # stopped, replaced or scaled down meanwhile
                try:
                    fresh = await self._start_instances(app, app.launch, 1, release_id)
                except DeployFailed as exc:
                    how = str(exc).splitlines()[0]
                    continue
                app.instances += fresh
                self._watch(app, fresh[0], release_id)
                self._publish(app)
                if len(app.instances) >= app.desired:
                    self._set_status(app, "running")
                app.log.write("system", "restarted; healthy again\n", release_id)
                return

    # ----- bookkeeping -----

    def _publish(self, app: LiveApp, reason: str = "") -> None:
        self.routes.set(app.slug, Route(tuple(app.instances), reason or "no healthy instance"))

    def _live(self, deployment_id: str) -> LiveApp:
        if (app := self._apps.get(deployment_id)) is None:
            with self.sessions() as db:
                deployment = db.get(Deployment, deployment_id)
                if deployment is None:
                    raise DeploymentNotFound("this project has no deployment")
                app = LiveApp(deployment_id, deployment.project_id, deployment.slug,
                              DeployLog(self.root / "logs" / f"{deployment_id}.log"), desired=deployment.instances)
            self._apps[deployment_id] = app
        return app

    def _deployment(self, db: Session, project_id: str) -> Deployment:
        deployment = db.scalar(select(Deployment).where(Deployment.project_id == project_id))
        if deployment is None:
            raise DeploymentNotFound("this project has not been deployed yet")
        return deployment

    def _new_slug(self, db: Session, project_id: str) -> str:
        project = db.get(Project, project_id)
        base = _slug_base(project.name if project else "app")
        while db.scalar(select(Deployment.id).where(Deployment.slug == (slug := f"{base}-{secrets.token_hex(3)}"))):
            pass
        return slug

    def _rollback_ids(self, db: Session, deployment: Deployment) -> set[str]:
        rows = db.scalars(select(Release.id).where(Release.deployment_id == deployment.id, Release.live_at.is_not(None))
                          .order_by(Release.number.desc()).limit(ROLLBACK_RELEASES + 1)).all()
        return {r for r in rows if r != deployment.current_release_id}

    def _release_dir(self, deployment_id: str, release_id: str) -> Path:
        return self.root / "releases" / deployment_id / release_id

    def _set_release(self, release_id: str, **values) -> None:
        with self.sessions() as db, db.begin():
            if (release := db.get(Release, release_id)) is not None:
                for key, value in values.items():
                    setattr(release, key, value)

    def _set_status(self, app: LiveApp, status: str) -> None:
        with self.sessions() as db, db.begin():
            if (deployment := db.get(Deployment, app.deployment_id)) is not None:
                deployment.status = status

    def _went_live(self, app: LiveApp, release_id: str, previous: str | None, instances: int) -> None:
        with self.sessions() as db, db.begin():
            deployment = db.get(Deployment, app.deployment_id)
            if deployment is None:
                return
            for row in db.scalars(select(Release).where(Release.deployment_id == deployment.id,
                                                        Release.status == "live", Release.id != release_id)):
                row.status = "retired"
            release = db.get(Release, release_id)
            release.status, release.live_at, release.finished_at, release.message = "live", _now(), _now(), ""
            deployment.current_release_id, deployment.status, deployment.instances = release_id, "running", instances
            number = release.number
        app.log.write("system", f"release {number} is live{' (was ' + previous + ')' if previous else ''}\n", release_id)

    def _fail(self, app: LiveApp, release_id: str, message: str, was_live: bool) -> None:
        """Record why a release did not go live; what served before keeps serving."""
        app.log.write("system", f"release failed, not switched: {message.splitlines()[0]}\n", release_id)
        with self.sessions() as db, db.begin():
            release = db.get(Release, release_id)
            deployment = db.get(Deployment, app.deployment_id)
            if release is not None:
                release.message, release.finished_at = message[-8000:], _now()
                if release.status != "live":  # a current release that cannot start again stays current
                    release.status = "retired" if was_live else "failed"
            if deployment is not None and (deployment.current_release_id in (None, release_id)):
                deployment.status = "failed"
        if not was_live:
            shutil.rmtree(self._release_dir(app.deployment_id, release_id), ignore_errors=True)

    def _prune(self, app: LiveApp) -> None:
        """Keep the folders of the releases one can roll back to (and the current one); old rows go too."""
        with self.sessions() as db, db.begin():
            deployment = db.get(Deployment, app.deployment_id)
            if deployment is None:
                return
            keep = self._rollback_ids(db, deployment) | {deployment.current_release_id}
            rows = db.scalars(select(Release).where(Release.deployment_id == deployment.id)
                              .order_by(Release.number.desc())).all()
            for index, row in enumerate(rows):
                if row.id not in keep and row.status not in ("building", "starting"):
                    shutil.rmtree(self._release_dir(app.deployment_id, row.id), ignore_errors=True)
                    if index >= KEPT_RELEASE_ROWS:
                        db.delete(row)

    def _require_backend(self) -> None:
        if self.backend is None:
            raise SandboxUnavailable(self.unavailable)

    def _spawn(self, coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
