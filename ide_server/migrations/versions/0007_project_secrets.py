"""Per-project environment variables and secrets, encrypted at rest.

Revision ID: 0007_project_secrets
Revises: 0006_assistant_settings
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_project_secrets"
down_revision = "0006_assistant_settings"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "project_secrets",
        sa.Column("project_id", sa.String(16), sa.ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("sealed", sa.LargeBinary(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.Integer(), sa.ForeignKey("users.id", ondelete="SET NULL"), nullable=True),
    )
    op.create_table(
        "project_secret_settings",
        sa.Column("project_id", sa.String(16), sa.ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("expose_to_runs", sa.Boolean(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("project_secret_settings")
    op.drop_table("project_secrets")
