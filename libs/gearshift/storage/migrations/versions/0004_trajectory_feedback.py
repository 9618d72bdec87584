"""Whether a trajectory's reward is a client's verdict (the gateway's feedback: Reward.verifier
"feedback" or "feedback:<grader>"), so training from traffic selects those on an index. Existing
rows are backfilled from their stored reward.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gearshift.api.common.v1.common_pb2 import Reward
from gearshift.rewards.feedback import is_feedback

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

BACKFILL_CHUNK = 1_000  # scored rows read per round trip; their rewards are parsed here

_rows = sa.table(
    "trajectories", sa.column("id", sa.String), sa.column("reward", sa.LargeBinary), sa.column("feedback", sa.Boolean)
)


def upgrade() -> None:
    with op.batch_alter_table("trajectories") as table:
        table.add_column(sa.Column("feedback", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_index("ix_trajectories_feedback_created_at_us", "trajectories", ["feedback", "created_at_us"])
    _backfill(op.get_bind())


def _backfill(connection: sa.Connection) -> None:
    """Marks the stored feedback: the verifier sits inside the serialized reward, which only
    protobuf reads, so the scored rows pass through here in id order, a chunk at a time."""
    after = ""
    while True:
        chunk = connection.execute(
            sa.select(_rows.c.id, _rows.c.reward)
            .where(_rows.c.reward.is_not(None), _rows.c.id > after)
            .order_by(_rows.c.id)
            .limit(BACKFILL_CHUNK)
        ).all()
        if not chunk:
            return
        marked = [row.id for row in chunk if is_feedback(Reward.FromString(row.reward).verifier)]
        if marked:
            connection.execute(sa.update(_rows).where(_rows.c.id.in_(marked)).values(feedback=True))
        after = chunk[-1].id


def downgrade() -> None:
    op.drop_index("ix_trajectories_feedback_created_at_us", "trajectories")
    with op.batch_alter_table("trajectories") as table:
        table.drop_column("feedback")
