"""ProjectSecrets: per-project environment variables, sealed at rest, never shown after writing.

The rules live here: names are environment variable names that cannot shadow what the sandbox or
the deploy runner sets (PATH, PORT, ...), values are bounded, and nothing here logs a value.
Deploys read every variable with `environment_for(db, project_id)` (the instance lives at
`app.state.services.secrets`); runs get them only when the owner turned on `expose_to_runs`
(`run_environment_for`, which the sandbox's run path reads through `app.state.services`).
"""

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from deploy_service.secret_box import SecretBox, SecretUnreadable
from deploy_service.secret_models import ProjectSecret, ProjectSecretSettings
from ide_server.errors import Conflict, InvalidInput, NotFound
from ide_server.models import User, utcnow

log = logging.getLogger(__name__)
T = TypeVar("T")

NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# Set by the sandbox, the deploy runner or the dynamic loader; a secret must not replace them.
RESERVED_NAMES = frozenset({
    "PATH", "HOME", "PORT", "HOST", "LANG", "TERM", "USER", "SHELL", "PWD", "HOSTNAME", "TMPDIR",
    "PYTHONUNBUFFERED", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "NODE_PATH", "NODE_OPTIONS",
    "VIRTUAL_ENV", "IFS", "ENV", "BASH_ENV",
})
RESERVED_PREFIXES = ("CODEYARD_", "LD_", "BASH_FUNC_")
MAX_VALUE_BYTES = 32 * 1024
MAX_SECRETS_PER_PROJECT = 100


@dataclass(frozen=True)
class SecretInfo:
    """What may be shown about a secret: that it is set, when and by whom; never its value."""

    name: str
    updated_at: datetime
    updated_by: str | None


def check_name(name: str) -> str:
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidInput("name: must be an environment variable name (letters, digits and _, not starting "
                           "with a digit, at most 64 characters)")
    if name.upper() in RESERVED_NAMES or name.upper().startswith(RESERVED_PREFIXES):
        raise InvalidInput(f"name: {name} is reserved (set by Codeyard itself); choose another name")
    return name


def check_value(value: str) -> str:
    if "\0" in value:
        raise InvalidInput("value: must not contain NUL characters")
    if len(value.encode()) > MAX_VALUE_BYTES:
        raise InvalidInput(f"value: must be at most {MAX_VALUE_BYTES} bytes")
    return value


def _again_if_raced(db: Session, write: Callable[[], T]) -> T:
    """Run a write that may insert; if a concurrent request inserted the same key first, run it
    again (it now updates that row) instead of failing with the primary key's error."""
    try:
        return write()
    except IntegrityError:
        db.rollback()
        return write()


class ProjectSecrets:
    """Reads and writes one server's project secrets through its SecretBox."""

    def __init__(self, box: SecretBox) -> None:
        self.box = box

    def list_for(self, db: Session, project_id: str) -> list[SecretInfo]:
        rows = db.execute(
            select(ProjectSecret.name, ProjectSecret.updated_at, User.username)
            .outerjoin(User, User.id == ProjectSecret.updated_by)
            .where(ProjectSecret.project_id == project_id)
            .order_by(ProjectSecret.name)
        ).all()
        return [SecretInfo(name, updated_at, username) for name, updated_at, username in rows]

    def put(self, db: Session, project_id: str, name: str, value: str, user: User) -> tuple[SecretInfo, bool]:
        """Set (or replace) a secret; returns what may be shown and whether it is new."""
        check_name(name)
        check_value(value)
        return _again_if_raced(db, lambda: self._put(db, project_id, name, value, user))

    def _put(self, db: Session, project_id: str, name: str, value: str, user: User) -> tuple[SecretInfo, bool]:
        row = db.get(ProjectSecret, (project_id, name))
        created = row is None
        if row is None:
            count = db.execute(select(func.count()).where(ProjectSecret.project_id == project_id)).scalar_one()
            if count >= MAX_SECRETS_PER_PROJECT:
                raise Conflict(f"a project can have at most {MAX_SECRETS_PER_PROJECT} secrets; delete one first")
            row = ProjectSecret(project_id=project_id, name=name)
            db.add(row)
        row.sealed = self.box.seal(value, project_id, name)
        row.updated_at, row.updated_by = utcnow(), user.id
        db.commit()
        log.info("secret %s %s in project %s by user %s", name, "added" if created else "replaced", project_id, user.id)
        return SecretInfo(name, row.updated_at, user.username), created

    def delete(self, db: Session, project_id: str, name: str) -> None:
        row = db.get(ProjectSecret, (project_id, name))
        if row is None:
            raise NotFound(f"no secret named {name[:64]!r} in this project")
        db.delete(row)
        db.commit()
        log.info("secret %s deleted in project %s", name, project_id)

    def exposed_to_runs(self, db: Session, project_id: str) -> bool:
        return bool(db.scalar(select(ProjectSecretSettings.expose_to_runs).where(ProjectSecretSettings.project_id == project_id)))

    def set_exposed_to_runs(self, db: Session, project_id: str, expose: bool) -> None:
        def write() -> None:
            row = db.get(ProjectSecretSettings, project_id) or ProjectSecretSettings(project_id=project_id)
            row.expose_to_runs = expose
            db.add(row)
            db.commit()

        _again_if_raced(db, write)
        log.info("secrets %s runs of project %s", "exposed to" if expose else "hidden from", project_id)

    def environment_for(self, db: Session, project_id: str) -> dict[str, str]:
        """Every secret of the project, decrypted: for its deploys only.

        Raises Conflict naming a secret that no longer opens (the server key changed), so a deploy
        fails with a clear reason instead of starting without it."""
        rows = db.scalars(select(ProjectSecret).where(ProjectSecret.project_id == project_id)).all()
        try:
            return {row.name: self.box.open(row.sealed, project_id, row.name) for row in rows}
        except SecretUnreadable as exc:
            raise Conflict(f"{exc}: set it again, or have the admin run `codeyard secrets reseal` with the old key") from None

    def reseal(self, db: Session, old: SecretBox) -> tuple[int, list[str]]:
        """Re-seal under this box's key every secret sealed under `old` (the previous server key).

        Returns how many were re-sealed, and "project/NAME" of those that neither key opens."""
        resealed, unreadable = 0, []
        for row in db.scalars(select(ProjectSecret).order_by(ProjectSecret.project_id, ProjectSecret.name)).all():
            try:
                self.box.open(row.sealed, row.project_id, row.name)
                continue  # already under the current key
            except SecretUnreadable:
                pass
            try:
                value = old.open(row.sealed, row.project_id, row.name)
            except SecretUnreadable:
                unreadable.append(f"{row.project_id}/{row.name}")
                continue
            row.sealed = self.box.seal(value, row.project_id, row.name)
            resealed += 1
        db.commit()
        log.info("re-sealed %d secrets under the current key; %d open with neither key", resealed, len(unreadable))
        return resealed, unreadable

    def run_environment_for(self, db: Session, project_id: str) -> dict[str, str]:
        """The secrets a run of the project gets: all of them if the owner allows it, else none."""
        return self.environment_for(db, project_id) if self.exposed_to_runs(db, project_id) else {}
