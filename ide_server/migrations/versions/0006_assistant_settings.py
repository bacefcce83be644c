"""The IDE assistant: the per-project switch.

Revision ID: 0006_assistant_settings
Revises: 0005_tutorials
Create Date: 2026-11-30
"""

import sqlalchemy as sa  # noqa: F401
from alembic import op  # noqa: F401

revision = "0006_assistant_settings"
down_revision = "0005_tutorials"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
