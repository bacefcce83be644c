"""Runs name the server that follows them, so a starting replica closes only dead servers' runs.

Revision ID: 0008_run_servers
Revises: 0007_project_secrets
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0008_run_servers"
down_revision = "0007_project_secrets"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sandbox_runs") as batch:
        batch.add_column(sa.Column("server_id", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sandbox_runs") as batch:
        batch.drop_column("server_id")
