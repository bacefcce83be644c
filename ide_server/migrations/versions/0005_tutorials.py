"""Tutorials: lesson progress and classrooms.

Revision ID: 0005_tutorials
Revises: 0004_deployments
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_tutorials"
down_revision = "0004_deployments"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "lesson_progress",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("course_slug", sa.String(64), nullable=False),
        sa.Column("lesson_slug", sa.String(64), nullable=False),
        sa.Column("project_id", sa.String(16), sa.ForeignKey("projects.id", ondelete="SET NULL"), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("hints_used", sa.Integer(), nullable=False),
        sa.Column("last_status", sa.String(16), nullable=True),
        sa.Column("last_result", sa.JSON(), nullable=True),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("last_checked_at", TS, nullable=True),
        sa.Column("passed_at", TS, nullable=True),
        sa.UniqueConstraint("user_id", "course_slug", "lesson_slug", name="uq_lesson_progress_user_lesson"),
    )
    op.create_index("ix_lesson_progress_user_id", "lesson_progress", ["user_id"])
    op.create_index("ix_lesson_progress_project_id", "lesson_progress", ["project_id"])
    op.create_table(
        "classrooms",
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("teacher_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("join_code", sa.String(16), nullable=False, unique=True),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_classrooms_teacher_id", "classrooms", ["teacher_id"])
    op.create_table(
        "classroom_courses",
        sa.Column("classroom_id", sa.String(16), sa.ForeignKey("classrooms.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("course_slug", sa.String(64), primary_key=True),
        sa.Column("position", sa.Integer(), nullable=False),
    )
    op.create_table(
        "classroom_students",
        sa.Column("classroom_id", sa.String(16), sa.ForeignKey("classrooms.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("joined_at", TS, nullable=False),
    )
    op.create_index("ix_classroom_students_user_id", "classroom_students", ["user_id"])


def downgrade() -> None:
    for table in ("classroom_students", "classroom_courses", "classrooms", "lesson_progress"):
        op.drop_table(table)
