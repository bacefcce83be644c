"""DeployRules: what may be deployed, and the database's record of what should run.

Every check a deploy, rollback or scale must pass before anything starts lives here (a bounded
queue of releases per project, only recent live releases to roll back to, 1..MAX_INSTANCES
instances), with the rows that record each release's fate. It knows nothing of running apps.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from deploy_service.detect import MAX_INSTANCES
from deploy_service.models import Deployment, Release
from deploy_service.schemas import ReleasePublic
from ide_server.errors import Conflict, InvalidInput, NotFound
from ide_server.models import Project, User

ROLLBACK_RELEASES = 5  # successful releases kept (folders and all) for rollback
KEPT_RELEASE_ROWS = 30
MAX_PENDING_RELEASES = 3  # deploys of one project waiting their turn (a double click queues, a script can't pile up)
UNDER_WAY = ("building", "starting")


class DeploymentNotFound(NotFound):
    pass


class DeployFailed(Exception):
    """A release could not go live; the message says why, with the tail of its log."""


def _now() -> datetime:
    return datetime.now(UTC)


def _slug_base(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:24].strip("-") or "app"


@dataclass(frozen=True)
class NewRelease:
    deployment_id: str
    release_id: str
    number: int


@dataclass(frozen=True)
class Restorable:
    """After a restart: the releases to start again (deployment id, release id), the slugs of stopped apps."""

    wanted: list[tuple[str, str]]
    stopped_slugs: list[str]


class DeployRules:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    # ----- admission: what may be deployed -----

    def open_release(self, user: User, project_id: str) -> NewRelease:
        """A "building" release of the project (its deployment created on the first deploy), or Conflict
        when MAX_PENDING_RELEASES are already under way."""
        with self.sessions() as db, db.begin():
            deployment = db.scalar(select(Deployment).where(Deployment.project_id == project_id))
            if deployment is None:
                deployment = Deployment(id=secrets.token_hex(8), project_id=project_id, slug=self._new_slug(db, project_id),
                                        status="deploying", instances=1)
                db.add(deployment)
                db.flush()
            pending = db.scalar(select(func.count()).select_from(Release).where(
                Release.deployment_id == deployment.id, Release.status.in_(UNDER_WAY))) or 0
            if pending >= MAX_PENDING_RELEASES:
                raise Conflict(f"{pending} deploys of this project are already under way; wait for them to finish")
            number = (db.scalar(select(func.max(Release.number)).where(Release.deployment_id == deployment.id)) or 0) + 1
            release = Release(id=secrets.token_hex(8), deployment_id=deployment.id, number=number, status="building",
                              plan={}, message="", user_id=user.id)
            db.add(release)
            if deployment.current_release_id is None:
                deployment.status = "deploying"
            return NewRelease(deployment.id, release.id, number)

    def rollback_target(self, project_id: str, release_id: str) -> NewRelease:
        """The release to roll back to: one of the last ROLLBACK_RELEASES that went live, not the current one."""
        with self.sessions() as db:
            deployment = self.deployment(db, project_id)
            release = db.get(Release, release_id)
            if release is None or release.deployment_id != deployment.id:
                raise InvalidInput(f"release_id: no release {release_id} in this deployment")
            if release.id not in self._rollback_ids(db, deployment):
                raise InvalidInput(f"release_id: release {release.number} cannot be rolled back to (only the last "
                                   f"{ROLLBACK_RELEASES} releases that went live, other than the current one)")
            return NewRelease(deployment.id, release.id, release.number)

    @staticmethod
    def check_instances(instances: int) -> None:
        if not 1 <= instances <= MAX_INSTANCES:
            raise InvalidInput(f"instances: must be from 1 to {MAX_INSTANCES}")

    # ----- reading -----

    def deployment(self, db: Session, project_id: str) -> Deployment:
        """The project's deployment as stored now (read again, not from the session's identity map)."""
        deployment = db.scalar(select(Deployment).where(Deployment.project_id == project_id)
                               .execution_options(populate_existing=True))
        if deployment is None:
            raise DeploymentNotFound("this project has not been deployed yet")
        return deployment

    def deployment_id(self, project_id: str) -> str:
        with self.sessions() as db:
            return self.deployment(db, project_id).id

    def deployment_by_id(self, deployment_id: str) -> Deployment:
        with self.sessions() as db:
            deployment = db.get(Deployment, deployment_id)
            if deployment is None:
                raise DeploymentNotFound("this project has no deployment")
            return deployment

    def deployment_ids(self) -> set[str]:
        with self.sessions() as db:
            return set(db.scalars(select(Deployment.id)))

    def releases(self, project_id: str) -> tuple[Deployment, list[ReleasePublic]]:
        """The deployment and its last KEPT_RELEASE_ROWS releases, newest first, each saying if it can be rolled back to.

        The releases are read between two reads of the deployment's status, again until both agree: each
        SELECT sees the latest commit (SQLite outside a write, PostgreSQL's read committed), and a release
        going live between two of them showed it live under a deployment still "deploying" (seen in CI)."""
        with self.sessions() as db:
            deployment = self.deployment(db, project_id)
            while True:
                seen = (deployment.status, deployment.current_release_id)
                rows = db.scalars(select(Release).where(Release.deployment_id == deployment.id)
                                  .order_by(Release.number.desc()).limit(KEPT_RELEASE_ROWS)
                                  .execution_options(populate_existing=True)).all()
                can_roll_back = self._rollback_ids(db, deployment)
                deployment = self.deployment(db, project_id)
                if (deployment.status, deployment.current_release_id) == seen:
                    return deployment, [ReleasePublic.model_validate(r).model_copy(update={"can_roll_back": r.id in can_roll_back})
                                        for r in rows]

    def rollout_start(self, deployment_id: str, release_id: str) -> tuple[bool, int] | None:
        """(whether the release was ever live, the instances the deployment wants); None once either row is gone."""
        with self.sessions() as db:
            release = db.get(Release, release_id)
            deployment = db.get(Deployment, deployment_id)
            if release is None or deployment is None:
                return None
            return release.live_at is not None, deployment.instances

    # ----- recording what happened -----

    def set_release(self, release_id: str, **values: Any) -> None:
        with self.sessions() as db, db.begin():
            if (release := db.get(Release, release_id)) is not None:
                for key, value in values.items():
                    setattr(release, key, value)

    def set_status(self, deployment_id: str, status: str) -> None:
        with self.sessions() as db, db.begin():
            if (deployment := db.get(Deployment, deployment_id)) is not None:
                deployment.status = status

    def delete(self, deployment_id: str) -> None:
        with self.sessions() as db, db.begin():
            if (row := db.get(Deployment, deployment_id)) is not None:
                db.delete(row)

    def set_instances(self, deployment_id: str, instances: int) -> None:
        with self.sessions() as db, db.begin():
            if (deployment := db.get(Deployment, deployment_id)) is not None:
                deployment.instances = instances

    def went_live(self, deployment_id: str, release_id: str, instances: int) -> int | None:
        """The release serves now (earlier live ones retire): its number, or None when the deployment is gone."""
        with self.sessions() as db, db.begin():
            deployment = db.get(Deployment, deployment_id)
            if deployment is None:
                return None
            for row in db.scalars(select(Release).where(Release.deployment_id == deployment.id,
                                                        Release.status == "live", Release.id != release_id)):
                row.status = "retired"
            release = db.get(Release, release_id)
            assert release is not None
            release.status, release.live_at, release.finished_at, release.message = "live", _now(), _now(), ""
            deployment.current_release_id, deployment.status, deployment.instances = release_id, "running", instances
            return release.number

    def failed(self, deployment_id: str, release_id: str, message: str, was_live: bool) -> None:
        """Record why a release did not go live; what served before keeps serving."""
        with self.sessions() as db, db.begin():
            release = db.get(Release, release_id)
            deployment = db.get(Deployment, deployment_id)
            if release is not None:
                release.message, release.finished_at = message[-8000:], _now()
                if release.status != "live":  # a current release that cannot start again stays current
                    release.status = "retired" if was_live else "failed"
            if deployment is not None and (deployment.current_release_id in (None, release_id)):
                deployment.status = "failed"

    def prune(self, deployment_id: str) -> list[str]:
        """Releases whose folders can go (not the current one, nor one to roll back to); rows past
        KEPT_RELEASE_ROWS are deleted too."""
        with self.sessions() as db, db.begin():
            deployment = db.get(Deployment, deployment_id)
            if deployment is None:
                return []
            keep = self._rollback_ids(db, deployment) | {deployment.current_release_id}
            rows = db.scalars(select(Release).where(Release.deployment_id == deployment.id)
                              .order_by(Release.number.desc())).all()
            gone = []
            for index, row in enumerate(rows):
                if row.id not in keep and row.status not in UNDER_WAY:
                    gone.append(row.id)
                    if index >= KEPT_RELEASE_ROWS:
                        db.delete(row)
            return gone

    def restorable(self) -> Restorable:
        """After a server start: releases under way failed with the server; what served should serve again."""
        wanted, stopped = [], []
        with self.sessions() as db, db.begin():
            for release in db.scalars(select(Release).where(Release.status.in_(UNDER_WAY))):
                release.status, release.finished_at = "failed", _now()
                release.message = "the server stopped while this release was being deployed"
            for deployment in db.scalars(select(Deployment)):
                if deployment.current_release_id is None:
                    deployment.status = "failed" if deployment.status == "deploying" else deployment.status
                elif deployment.status in ("running", "unhealthy", "deploying"):
                    wanted.append((deployment.id, deployment.current_release_id))
                elif deployment.status == "stopped":
                    stopped.append(deployment.slug)
        return Restorable(wanted, stopped)

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
