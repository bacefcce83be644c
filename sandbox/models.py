"""The sandbox_runs table: each run's outcome, kept after the in-memory record is gone."""

from datetime import datetime

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from ide_server.db import Base
from ide_server.models import UTCDateTime, utcnow


class RunRow(Base):
    """One run of a project's code; output is stored up to `runs.STORED_OUTPUT_CHARS` per stream."""

    __tablename__ = "sandbox_runs"
    __table_args__ = (Index("ix_sandbox_runs_project_created", "project_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"), index=True)
    argv: Mapped[list[str]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16))
    verdict: Mapped[str | None] = mapped_column(String(32), default=None)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    signal: Mapped[int | None] = mapped_column(Integer, default=None)
    cpu_seconds: Mapped[float | None] = mapped_column(Float, default=None)
    wall_seconds: Mapped[float | None] = mapped_column(Float, default=None)
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    stdout: Mapped[str] = mapped_column(Text, default="")
    stderr: Mapped[str] = mapped_column(Text, default="")
    output_truncated: Mapped[bool] = mapped_column(default=False)
    files_written: Mapped[list[str]] = mapped_column(JSON, default=list)
    message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    server_id: Mapped[str | None] = mapped_column(String(16), default=None)  # who follows it (server_presence)
