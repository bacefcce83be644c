"""AppSupervisor: the apps that run in this process, their instances, crashes and clean-up.

It starts healthy instances (within the server's cap), takes them out of the route before they
stop (in-flight requests finish), restarts a crashed one with backoff, and removes what a deleted
deployment left. Each deployment has one lock; whoever changes its instances holds it.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy_service.instance import AppInstance, Launch
from deploy_service.logs import DeployLog
from deploy_service.proxy import Route, Routes
from deploy_service.rules import DeployFailed, DeployRules
from ide_server.errors import Conflict
from sandbox import Hosting, SandboxUnavailable

log = logging.getLogger(__name__)

HEALTH_TIMEOUT = 30.0
DRAIN_TIMEOUT = 30.0
BACKOFF_START, BACKOFF_MAX, STABLE_SECONDS = 0.5, 30.0, 60.0
RECONCILE_SECONDS = 5.0
MAX_RUNNING_INSTANCES = 32  # on this server, all deployments together (each may use APP_LIMITS' memory)


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


class AppSupervisor:
    def __init__(self, *, rules: DeployRules, routes: Routes, hosting: Hosting | None, root: Path,
                 max_instances: int = MAX_RUNNING_INSTANCES) -> None:
        self.rules, self.routes, self.hosting, self.root = rules, routes, hosting, root
        self.max_instances = max_instances
        self.apps: dict[str, LiveApp] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        for name in ("releases", "logs"):
            (root / name).mkdir(parents=True, exist_ok=True)

    def live(self, deployment_id: str) -> LiveApp:
        """The deployment's live state (created, stopped, on first use)."""
        if (app := self.apps.get(deployment_id)) is None:
            deployment = self.rules.deployment_by_id(deployment_id)
            app = LiveApp(deployment_id, deployment.project_id, deployment.slug,
                          DeployLog(self.root / "logs" / f"{deployment_id}.log"), desired=deployment.instances)
            self.apps[deployment_id] = app
        return app

    def healthy(self, deployment_id: str) -> int:
        app = self.apps.get(deployment_id)
        return sum(1 for i in app.instances if not i.exited) if app else 0

    def release_dir(self, deployment_id: str, release_id: str) -> Path:
        return self.root / "releases" / deployment_id / release_id

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ----- instances -----

    async def start_instances(self, app: LiveApp, launch: Launch, count: int, release_id: str) -> list[AppInstance]:
        """`count` healthy instances, or DeployFailed (and none left running). The cap counts this replica's instances
        wherever they run (here, or on runner nodes, which refuse what exceeds their own capacity)."""

        def sink(stream: str, line: str) -> None:
            app.log.write(stream, line, release_id)

        running = sum(len(a.instances) + len(a.draining) for a in self.apps.values())
        if running + count > self.max_instances:
            raise DeployFailed(f"the server already runs {running} app instances, its maximum is {self.max_instances}: "
                               "stop an app (or scale one down) first")
        assert self.hosting is not None
        instances = [AppInstance(self.hosting, launch, sink) for _ in range(count)]
        reasons: list[str | None]
        try:
            await asyncio.gather(*(i.start() for i in instances))
            reasons = list(await asyncio.gather(*(i.wait_healthy(HEALTH_TIMEOUT) for i in instances)))
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

    def serve(self, app: LiveApp, fresh: list[AppInstance], launch: Launch, release_id: str, desired: int) -> list[AppInstance]:
        """Switch the route to a release's fresh instances (one assignment) and watch them; the old ones come back
        (marked stopping: their exit is no crash) for the caller to retire."""
        old = app.instances
        app.instances, app.launch, app.release_id, app.desired = fresh, launch, release_id, desired
        app.stopped, app.restarts = False, 0
        self.publish(app)
        for instance in old:
            instance.stopping = True
        for instance in fresh:
            self._watch(app, instance, release_id)
        return old

    async def retire(self, app: LiveApp, instances: list[AppInstance], reason: str) -> None:
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

    async def resize(self, app: LiveApp) -> None:
        """Start or retire instances until `app.desired` serve (Conflict when new ones cannot start)."""
        assert app.launch is not None and app.release_id is not None
        extra = app.desired - len(app.instances)
        if extra > 0:
            try:
                fresh = await self.start_instances(app, app.launch, extra, app.release_id)
            except DeployFailed as exc:
                app.log.write("system", f"scaling up failed: {exc}\n", app.release_id)
                raise Conflict(f"scaling up failed: {str(exc).splitlines()[0]}") from None
            app.instances += fresh
            for instance in fresh:
                self._watch(app, instance, app.release_id)
            self.publish(app)
        elif extra < 0:
            surplus = app.instances[extra:]
            app.instances = app.instances[:extra]
            self.publish(app)
            await self.retire(app, surplus, "")
        app.log.write("system", f"scaled to {app.desired} instance(s)\n", app.release_id)
        self.rules.set_status(app.deployment_id, "running")

    async def stop(self, app: LiveApp) -> None:
        async with app.lock:
            app.stopped = True
            await self.retire(app, list(app.instances), "the app is stopped")
            app.instances = []
            self.rules.set_status(app.deployment_id, "stopped")
            app.log.write("system", "stopped\n", app.release_id)

    def publish(self, app: LiveApp, reason: str = "") -> None:
        self.routes.set(app.slug, Route(tuple(app.instances), reason or "no healthy instance"))

    # ----- crashes -----

    def _watch(self, app: LiveApp, instance: AppInstance, release_id: str) -> None:
        self.spawn(self._supervise(app, instance, release_id))

    async def _supervise(self, app: LiveApp, instance: AppInstance, release_id: str) -> None:
        """When an instance dies on its own: unhealthy, restart it with backoff until one is healthy again."""
        status = await instance.wait_exit()
        if instance.stopping or instance not in app.instances:
            return
        if time.monotonic() - instance.started_at > STABLE_SECONDS:
            app.restarts = 0
        how = instance.how_it_ended(status)
        async with app.lock:
            if instance not in app.instances:
                return  # retired meanwhile
            app.instances.remove(instance)
            self.publish(app, "restarting after a crash")
            self.rules.set_status(app.deployment_id, "unhealthy")
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
                    fresh = await self.start_instances(app, app.launch, 1, release_id)
                except DeployFailed as exc:
                    how = str(exc).splitlines()[0]
                    continue
                app.instances += fresh
                self._watch(app, fresh[0], release_id)
                self.publish(app)
                if len(app.instances) >= app.desired:
                    self.rules.set_status(app.deployment_id, "running")
                app.log.write("system", "restarted; healthy again\n", release_id)
                return

    # ----- removal and shut-down -----

    async def remove(self, app: LiveApp) -> None:
        """Stop a deployment whose row is gone and remove its files (releases, logs)."""
        async with app.lock:
            app.stopped = True
            await self.retire(app, list(app.instances), "the app was deleted")
            app.instances, app.launch = [], None
            self.routes.drop(app.slug)
            shutil.rmtree(self.root / "releases" / app.deployment_id, ignore_errors=True)
            app.log.remove()
        self.apps.pop(app.deployment_id, None)

    async def reconcile_forever(self, every: float = RECONCILE_SECONDS) -> None:
        """Deleting a project deletes its deployment rows (cascade): stop such apps and drop their files."""
        while True:
            await asyncio.sleep(every)
            try:
                present = await asyncio.to_thread(self.rules.deployment_ids)
                for app in [a for a in self.apps.values() if a.deployment_id not in present]:
                    await self.remove(app)
                for folder in (self.root / "releases").iterdir():
                    if folder.name not in present and folder.name not in self.apps:
                        shutil.rmtree(folder, ignore_errors=True)
            except Exception:
                log.exception("reconciling deployments failed")

    async def shutdown(self) -> None:
        """Stop every instance (the database still says what should run, for the next start, or for
        the replica that runs the apps after this one)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for app in self.apps.values():
            for instance in [*app.instances, *app.draining]:
                await instance.stop()
            app.instances, app.draining = [], []
            app.log.close()
        self.apps.clear()
        self.routes.clear()
