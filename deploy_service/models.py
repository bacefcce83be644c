"""Deployments and their releases, kept so that a restarted server brings every app back as it was."""

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from ide_server.db import Base
from ide_server.models import UTCDateTime, utcnow


class Deployment(Base):
    """A project's one deployment: its public slug, what should be running and how many instances."""

    __tablename__ = "deployments"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), unique=True)
    slug: Mapped[str] = mapped_column(String(48), unique=True)
    status: Mapped[str] = mapped_column(String(16))  # deploying | running | unhealthy | stopped | failed
    instances: Mapped[int] = mapped_column(Integer, default=1)
    current_release_id: Mapped[str | None] = mapped_column(String(16), default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Release(Base):
    """One snapshot of the project, built and started (or not); `live_at` marks one that served."""

    __tablename__ = "deploy_releases"
    __table_args__ = (Index("ix_deploy_releases_deployment_number", "deployment_id", "number", unique=True),)

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))  # building | starting | live | retired | failed
    kind: Mapped[str | None] = mapped_column(String(16), default=None)
    plan: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # argv, health path, package mounts and env
    message: Mapped[str] = mapped_column(Text, default="")
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"), default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    live_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
