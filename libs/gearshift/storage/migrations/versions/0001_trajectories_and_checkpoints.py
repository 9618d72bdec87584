"""Trajectories with indexed filter columns, checkpoints, and checkpoint lineage.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "trajectories",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("mode", sa.SmallInteger(), nullable=False),
        sa.Column("status", sa.SmallInteger(), nullable=False),
        sa.Column("correct", sa.Boolean(), nullable=True),
        sa.Column("reward_value", sa.Float(), nullable=True),
        sa.Column("task_source", sa.Text(), nullable=False),
        sa.Column("split", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("model_version", sa.Text(), nullable=False),
        sa.Column("created_at_us", sa.BigInteger(), nullable=False),
        sa.Column("reward", sa.LargeBinary(), nullable=True),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_trajectories"),
    )
    for columns in (
        ("created_at_us", "id"),
        ("mode", "created_at_us"),
        ("status", "created_at_us"),
        ("correct", "created_at_us"),
        ("reward_value",),
        ("task_source", "created_at_us"),
        ("split", "created_at_us"),
        ("run_id", "created_at_us"),
        ("model_version", "created_at_us"),
    ):
        op.create_index(f"ix_trajectories_{'_'.join(columns)}", "trajectories", list(columns))

    op.create_table(
        "checkpoints",
        sa.Column("id", sa.String(256), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("parent_id", sa.String(256), nullable=True),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("code_version", sa.Text(), nullable=False),
        sa.Column("dataset_snapshot", sa.Text(), nullable=False),
        sa.Column("eval_metrics", sa.JSON(), nullable=False),
        sa.Column("status", sa.SmallInteger(), nullable=False),
        sa.Column("created_at_us", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_checkpoints"),
        sa.ForeignKeyConstraint(["parent_id"], ["checkpoints.id"], name="fk_checkpoints_parent_id_checkpoints"),
    )
    for columns in (("kind", "created_at_us"), ("status", "created_at_us"), ("parent_id",)):
        op.create_index(f"ix_checkpoints_{'_'.join(columns)}", "checkpoints", list(columns))

    op.create_table(
        "checkpoint_trajectories",
        sa.Column("checkpoint_id", sa.String(256), nullable=False),
        sa.Column("trajectory_id", sa.String(36), nullable=False),
        sa.PrimaryKeyConstraint("checkpoint_id", "trajectory_id", name="pk_checkpoint_trajectories"),
        sa.ForeignKeyConstraint(
            ["checkpoint_id"], ["checkpoints.id"],
            name="fk_checkpoint_trajectories_checkpoint_id_checkpoints", ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["trajectory_id"], ["trajectories.id"], name="fk_checkpoint_trajectories_trajectory_id_trajectories"
        ),
    )
    op.create_index("ix_checkpoint_trajectories_trajectory_id", "checkpoint_trajectories", ["trajectory_id"])


def downgrade() -> None:
    op.drop_table("checkpoint_trajectories")
    op.drop_table("checkpoints")
    op.drop_table("trajectories")
