"""Tutorials: lesson progress and classrooms.

Revision ID: 0005_tutorials
Revises: 0004_deployments
Create Date: 2026-11-30
"""

import sqlalchemy as sa  # noqa: F401
from alembic import op  # noqa: F401

revision = "0005_tutorials"
down_revision = "0004_deployments"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
