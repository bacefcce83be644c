"""Tables of per-project secrets: the sealed values and the owner's "expose to runs" switch."""

from datetime import datetime

from sqlalchemy import ForeignKey, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from ide_server.db import Base
from ide_server.models import UTCDateTime, utcnow


class ProjectSecret(Base):
    """One environment variable of a project; `sealed` is SecretBox output, never the value."""

    __tablename__ = "project_secrets"

    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    sealed: Mapped[bytes] = mapped_column(LargeBinary)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_by: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"), default=None)


class ProjectSecretSettings(Base):
    """Per project: whether runs (not only deploys) get the secrets; off unless the owner turns it on."""

    __tablename__ = "project_secret_settings"

    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True)
    expose_to_runs: Mapped[bool] = mapped_column(default=False)
