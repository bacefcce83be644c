"""Bodies of the deployments API (shapes documented in deploy_service/__init__.py)."""

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from deploy_service.detect import MAX_INSTANCES


class ReleasePublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    number: int
    status: Literal["building", "starting", "live", "retired", "failed"]
    kind: str | None
    message: str
    can_roll_back: bool = False
    created_at: datetime
    finished_at: datetime | None


DeploymentStatus = Literal["deploying", "running", "unhealthy", "stopped", "failed"]


class DeploymentPublic(BaseModel):
    slug: str
    url: str
    status: DeploymentStatus
    instances: int
    healthy_instances: int
    current_release: ReleasePublic | None
    releases: list[ReleasePublic]


class RollbackCreate(BaseModel):
    release_id: str = Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_-]+$")


class ScaleUpdate(BaseModel):
    instances: int = Field(ge=1, le=MAX_INSTANCES)
