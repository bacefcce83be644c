"""One-click deploys: deployments, releases, per-project secrets.

Revision ID: 0004_deployments
Revises: 0003_collab_documents
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_deployments"
down_revision = "0003_collab_documents"
branch_labels = None
depends_on = None


TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "deployments",
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("project_id", sa.String(16), sa.ForeignKey("projects.id", ondelete="CASCADE"), nullable=False,
                  unique=True),
        sa.Column("slug", sa.String(48), nullable=False, unique=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("instances", sa.Integer(), nullable=False),
        sa.Column("current_release_id", sa.String(16), nullable=True),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "deploy_releases",
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("deployment_id", sa.String(16), sa.ForeignKey("deployments.id", ondelete="CASCADE"), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("kind", sa.String(16), nullable=True),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="SET NULL"), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("live_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
    )
    op.create_index("ix_deploy_releases_deployment_number", "deploy_releases", ["deployment_id", "number"], unique=True)


def downgrade() -> None:
    op.drop_table("deploy_releases")
    op.drop_table("deployments")
