"""Drops the checkpoints' (status, created_at_us) index: since 0005 a list by status orders by
status_at_us, on its own index, and no query reads this one.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_checkpoints_status_created_at_us", "checkpoints")


def downgrade() -> None:
    op.create_index("ix_checkpoints_status_created_at_us", "checkpoints", ["status", "created_at_us"])
