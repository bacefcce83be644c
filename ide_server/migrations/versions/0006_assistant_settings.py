"""The IDE assistant: the per-project switch.

Revision ID: 0006_assistant_settings
Revises: 0005_tutorials
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_assistant_settings"
down_revision = "0005_tutorials"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "assistant_settings",
        sa.Column("project_id", sa.String(16), sa.ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("assistant_settings")
