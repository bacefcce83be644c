"""Per-project environment variables and secrets, encrypted at rest.

Revision ID: 0007_project_secrets
Revises: 0006_assistant_settings
Create Date: 2026-11-30
"""

import sqlalchemy as sa  # noqa: F401
from alembic import op  # noqa: F401

revision = "0007_project_secrets"
down_revision = "0006_assistant_settings"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
