"""Collaborative documents: each room's CRDT update log, its compacted snapshot, and the hash of
the text last written to its file.

Revision ID: 0003_collab_documents
Revises: 0002_sandbox_runs
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_collab_documents"
down_revision = "0002_sandbox_runs"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
ROOM = sa.String(1024)
# Integer primary keys autoincrement on SQLite only when declared INTEGER.
LOG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "collab_doc_updates",
        sa.Column("id", LOG_ID, primary_key=True, autoincrement=True),
        sa.Column("room", ROOM, nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sqlite_autoincrement=True,  # never reuse the id of a deleted row (see collab.store.DocUpdate)
    )
    op.create_index("ix_collab_doc_updates_room_id", "collab_doc_updates", ["room", "id"])
    op.create_table(
        "collab_doc_snapshots",
        sa.Column("room", ROOM, primary_key=True),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_table(
        "collab_written_files",
        sa.Column("room", ROOM, primary_key=True),
        sa.Column("sha256", sa.String(64), nullable=True),
        sa.Column("pending_sha256", sa.String(64), nullable=True),
        sa.Column("updated_at", TS, nullable=False),
    )


def downgrade() -> None:
    for table in ("collab_written_files", "collab_doc_snapshots", "collab_doc_updates"):
        op.drop_table(table)
