"""The secrets API, /api/projects/{id}/secrets: thin handlers over ProjectSecrets.

Editors list names and write values (values are never sent back, only that one is set); viewers
see nothing, not even names. Only owners decide whether runs get the secrets too. Runs and deploys
are given the ProjectSecrets built here by the composition root (`ide_server/wiring.py`); a run's
environment comes from `run_environment_for`.
"""

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Response, status
from pydantic import BaseModel, Field, StrictBool
from starlette.requests import HTTPConnection

from deploy_service.secret_box import SecretBox
from deploy_service.secrets import MAX_VALUE_BYTES, ProjectSecrets, SecretInfo
from ide_server.components import Component
from ide_server.deps import DbSession, ProjectEditor, ProjectOwner
from ide_server.error_handlers import ERROR_RESPONSES
from ide_server.wiring import Builders, Core, required, services_of

router = APIRouter(prefix="/api/projects/{project_id}/secrets", tags=["secrets"], responses=ERROR_RESPONSES)


class SecretPublic(BaseModel):
    name: str
    is_set: bool = Field(True, description="Always true: values are write-only and never sent back.")
    updated_at: datetime
    updated_by: str | None


class SecretsPublic(BaseModel):
    expose_to_runs: bool = Field(description="Whether runs (not only deploys) get these variables; the owner decides.")
    secrets: list[SecretPublic]


class SecretUpdate(BaseModel):
    value: str = Field(max_length=MAX_VALUE_BYTES, description="Write-only; never shown again.")


class SecretSettingsUpdate(BaseModel):
    expose_to_runs: StrictBool  # strict: 0.0 or "no" is a 422, not False


async def _secrets(conn: HTTPConnection) -> ProjectSecrets:
    return required(services_of(conn.app.state).secrets, "secrets")


Secrets = Annotated[ProjectSecrets, Depends(_secrets)]


def _public(info: SecretInfo) -> SecretPublic:
    return SecretPublic(name=info.name, is_set=True, updated_at=info.updated_at, updated_by=info.updated_by)


def _listing(secrets: ProjectSecrets, db: DbSession, project_id: str) -> SecretsPublic:
    return SecretsPublic(expose_to_runs=secrets.exposed_to_runs(db, project_id),
                         secrets=[_public(info) for info in secrets.list_for(db, project_id)])


@router.get("")
def list_secrets(ctx: ProjectEditor, db: DbSession, secrets: Secrets) -> SecretsPublic:
    """Names of the project's secrets (editors and owners), never their values."""
    return _listing(secrets, db, ctx.project.id)


@router.patch("")
def update_secret_settings(body: SecretSettingsUpdate, ctx: ProjectOwner, db: DbSession, secrets: Secrets) -> SecretsPublic:
    """Let runs of the project get its secrets too, or stop them (owners); deploys always get them."""
    secrets.set_exposed_to_runs(db, ctx.project.id, body.expose_to_runs)
    return _listing(secrets, db, ctx.project.id)


@router.put("/{name}", responses={201: {"model": SecretPublic, "description": "Created"}})
def put_secret(name: str, body: SecretUpdate, ctx: ProjectEditor, db: DbSession, secrets: Secrets,
               response: Response) -> SecretPublic:
    """Set or replace a secret (200 when replaced, 201 when new); the value is never shown again."""
    assert ctx.user is not None
    info, created = secrets.put(db, ctx.project.id, name, body.value, ctx.user)
    if created:
        response.status_code = status.HTTP_201_CREATED
    return _public(info)


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_secret(name: str, ctx: ProjectEditor, db: DbSession, secrets: Secrets) -> None:
    secrets.delete(db, ctx.project.id, name)


def project_secrets(core: Core) -> ProjectSecrets:
    """Secrets sealed under the server's key."""
    key = core.settings.secret_key
    assert key is not None  # create_app's Settings.prepare() loaded or made it
    return ProjectSecrets(SecretBox(key.get_secret_value()))


component = Component(name="secrets", router=router, builds=Builders(secrets=project_secrets))
