"""Why each trajectory ran (serving, evaluation, gate, training data), so training data and the
retraining trigger can leave evaluation and gate runs out. Existing rows are serving (0).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trajectories") as table:
        table.add_column(sa.Column("purpose", sa.SmallInteger(), nullable=False, server_default="0"))
    op.create_index("ix_trajectories_purpose_created_at_us", "trajectories", ["purpose", "created_at_us"])


def downgrade() -> None:
    op.drop_index("ix_trajectories_purpose_created_at_us", "trajectories")
    with op.batch_alter_table("trajectories") as table:
        table.drop_column("purpose")
