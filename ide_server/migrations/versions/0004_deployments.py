"""One-click deploys: deployments, releases, per-project secrets.

Revision ID: 0004_deployments
Revises: 0003_collab_documents
Create Date: 2026-11-30
"""

import sqlalchemy as sa  # noqa: F401
from alembic import op  # noqa: F401

revision = "0004_deployments"
down_revision = "0003_collab_documents"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
