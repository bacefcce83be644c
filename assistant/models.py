"""The assistant_settings table: the per-project switch (a missing row means switched on)."""

from datetime import datetime

from sqlalchemy import ForeignKey
from sqlalchemy.orm import Mapped, mapped_column

from ide_server.db import Base
from ide_server.models import UTCDateTime, utcnow


class AssistantSetting(Base):
    __tablename__ = "assistant_settings"

    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True)
    enabled: Mapped[bool] = mapped_column(default=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
