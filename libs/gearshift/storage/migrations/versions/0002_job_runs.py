"""Orchestration job runs: one row per task run, keyed by its dedupe key.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_runs",
        sa.Column("key", sa.String(256), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.Column("external_id", sa.Text(), nullable=False),
        sa.Column("log", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("attempts", sa.SmallInteger(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("created_at_us", sa.BigInteger(), nullable=False),
        sa.Column("heartbeat_at_us", sa.BigInteger(), nullable=False),
        sa.Column("finished_at_us", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("key", name="pk_job_runs"),
    )
    for columns in (("kind", "created_at_us"), ("status", "created_at_us")):
        op.create_index(f"ix_job_runs_{'_'.join(columns)}", "job_runs", list(columns))


def downgrade() -> None:
    op.drop_table("job_runs")
