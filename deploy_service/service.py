"""DeployService: the deploys' face to the API, over three parts with one job each.

`DeployRules` (rules.py) decides what may be deployed and records what should run, in the
database; `ReleasePipeline` (rollout.py) turns a snapshot into a release serving traffic;
`AppSupervisor` (supervisor.py) keeps the live apps' instances running, restarts crashed ones and
removes what deleted deployments left. One lock per deployment orders deploys, rollbacks,
scaling, stops and crash restarts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import cast

from sqlalchemy.orm import Session, sessionmaker

from collab.editors import OpenEditors
from deploy_service.logs import DeployLog
from deploy_service.owner import Ownership, Replica
from deploy_service.proxy import Route, Routes
from deploy_service.rollout import ReleasePipeline
from deploy_service.rules import DeployRules
from deploy_service.schemas import DeploymentPublic, DeploymentStatus
from deploy_service.supervisor import MAX_RUNNING_INSTANCES, AppSupervisor
from ide_server.errors import Conflict
from ide_server.models import User
from sandbox import Backend, Hosting, Installer, LocalHosting, SandboxUnavailable

log = logging.getLogger(__name__)


class DeployService:
    def __init__(self, *, sessions: sessionmaker[Session], projects_dir: Path, root: Path, backend: Backend | None,
                 unavailable: str, installer: Installer | None, editors: OpenEditors,
                 secrets_of: Callable[[Session, str], dict[str, str]] | None, apps_host: str | None = None,
                 https: bool = False, max_instances: int = MAX_RUNNING_INSTANCES, hosting: Hosting | None = None) -> None:
        """backend: where builds run; hosting: where instances run (default: this machine, on `backend`)."""
        self.backend, self.unavailable, self.editors = backend, unavailable, editors
        if hosting is None and backend is not None:
            hosting = LocalHosting(backend)
        self.apps_host, self.https = apps_host, https
        self.routes = Routes()
        self.ownership = Ownership(Replica("lone", "", None), redis_url=None)  # a lone server runs the apps
        self.rules = DeployRules(sessions)
        self.supervisor = AppSupervisor(rules=self.rules, routes=self.routes, hosting=hosting, root=root,
                                        max_instances=max_instances)
        self.pipeline = ReleasePipeline(rules=self.rules, supervisor=self.supervisor, projects_dir=projects_dir,
                                        backend=backend, installer=installer, secrets_of=secrets_of)

    async def deploy(self, user: User, project_id: str) -> DeploymentPublic:
        """Snapshot the project now and roll it out in the background (202: the release is "building")."""
        self._require_backend()
        await self.editors.checkpoint(project_id, "Checkpoint before a deploy")
        new = self.rules.open_release(user, project_id)
        app = self.supervisor.live(new.deployment_id)
        app.log.write("system", f"release {new.number}: snapshot of the project taken, building\n", new.release_id)
        await self.pipeline.snapshot(app, project_id, new.release_id)
        self.pipeline.start(app, new.release_id, build=True)
        return self.status(project_id)

    async def rollback(self, project_id: str, release_id: str) -> DeploymentPublic:
        """Bring back one of the last successful releases (202; it goes live once healthy)."""
        self._require_backend()
        target = self.rules.rollback_target(project_id, release_id)
        app = self.supervisor.live(target.deployment_id)
        app.log.write("system", f"rolling back to release {target.number}\n", release_id)
        self.pipeline.start(app, release_id, build=False)
        return self.status(project_id)

    async def scale(self, project_id: str, instances: int) -> DeploymentPublic:
        """Run `instances` copies of the current release, round-robin (new ones serve once healthy)."""
        self.rules.check_instances(instances)
        app = self.supervisor.live(self.rules.deployment_id(project_id))
        async with app.lock:
            previous, app.desired = app.desired, instances
            try:
                if app.launch is not None and not app.stopped:
                    await self.supervisor.resize(app)
            except Conflict:
                app.desired = previous
                raise
            self.rules.set_instances(app.deployment_id, instances)
        return self.status(project_id)

    async def stop(self, project_id: str) -> DeploymentPublic:
        """Stop serving (in-flight requests finish first); a new deploy starts it again."""
        await self.supervisor.stop(self.supervisor.live(self.rules.deployment_id(project_id)))
        return self.status(project_id)

    async def delete(self, project_id: str) -> None:
        """Stop the app and remove the deployment, its releases and logs."""
        app = self.supervisor.live(self.rules.deployment_id(project_id))
        self.rules.delete(app.deployment_id)
        await self.supervisor.remove(app)

    def status(self, project_id: str) -> DeploymentPublic:
        deployment, releases = self.rules.releases(project_id)
        current = next((r for r in releases if r.id == deployment.current_release_id), None)
        return DeploymentPublic(slug=deployment.slug, url=self.url_of(deployment.slug), status=cast(DeploymentStatus, deployment.status),
                                instances=deployment.instances, healthy_instances=self.supervisor.healthy(deployment.id),
                                current_release=current, releases=releases)

    def log_of(self, project_id: str) -> DeployLog:
        return self.supervisor.live(self.rules.deployment_id(project_id)).log

    def url_of(self, slug: str) -> str:
        if self.apps_host:
            return f"{'https' if self.https else 'http'}://{slug}.apps.{self.apps_host}/"
        return f"/apps/{slug}/"

    async def restore(self) -> int:
        """After a server start: every deployment that was serving comes back with its release (and
        from then on, apps of deleted projects are stopped)."""
        self.supervisor.spawn(self.supervisor.reconcile_forever())
        restorable = self.rules.restorable()
        for slug in restorable.stopped_slugs:
            self.routes.set(slug, Route((), "the app is stopped"))
        if restorable.wanted and self.backend is None:
            log.warning("%d deployments cannot come back: %s", len(restorable.wanted), self.unavailable)
            return 0
        for deployment_id, release_id in restorable.wanted:
            app = self.supervisor.live(deployment_id)
            app.log.write("system", "the server restarted: starting the current release again\n", release_id)
            self.pipeline.start(app, release_id, build=False)
        return len(restorable.wanted)

    async def shutdown(self) -> None:
        await self.supervisor.shutdown()

    def _require_backend(self) -> None:
        if self.backend is None:
            raise SandboxUnavailable(self.unavailable)
