"""When each checkpoint's status was last set, so the newest PUBLISHED checkpoint is the one
published last (publishing an older one again rolls serving back to it). Existing rows take
their registration time.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as table:
        table.add_column(sa.Column("status_at_us", sa.BigInteger(), nullable=False, server_default="0"))
    checkpoints = sa.table("checkpoints", sa.column("created_at_us", sa.BigInteger), sa.column("status_at_us", sa.BigInteger))
    op.execute(checkpoints.update().values(status_at_us=checkpoints.c.created_at_us))
    op.create_index("ix_checkpoints_status_status_at_us", "checkpoints", ["status", "status_at_us"])


def downgrade() -> None:
    op.drop_index("ix_checkpoints_status_status_at_us", "checkpoints")
    with op.batch_alter_table("checkpoints") as table:
        table.drop_column("status_at_us")
