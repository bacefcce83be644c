"""Sandbox runs: one row per run (status, verdict, usage, bounded output).

Revision ID: 0002_sandbox_runs
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_sandbox_runs"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "sandbox_runs",
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("project_id", sa.String(16), sa.ForeignKey("projects.id", ondelete="CASCADE"), nullable=False),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="SET NULL"), nullable=True),
        sa.Column("argv", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("verdict", sa.String(32), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("signal", sa.Integer(), nullable=True),
        sa.Column("cpu_seconds", sa.Float(), nullable=True),
        sa.Column("wall_seconds", sa.Float(), nullable=True),
        sa.Column("peak_memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("stdout", sa.Text(), nullable=False),
        sa.Column("stderr", sa.Text(), nullable=False),
        sa.Column("output_truncated", sa.Boolean(), nullable=False),
        sa.Column("files_written", sa.JSON(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
    )
    op.create_index("ix_sandbox_runs_user_id", "sandbox_runs", ["user_id"])
    op.create_index("ix_sandbox_runs_project_created", "sandbox_runs", ["project_id", "created_at"])


def downgrade() -> None:
    op.drop_table("sandbox_runs")
