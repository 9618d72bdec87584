"""The store's tables. Filter columns are copied out of each trajectory so queries run on
indexes; the full trajectory is kept as its serialized protobuf, which is fast to write and
read back whole."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Text,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Stable constraint names, so migrations can refer to them on every dialect.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

TRAJECTORY_ID_CHARS = 36  # a canonical UUID
CHECKPOINT_ID_CHARS = 256


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class TrajectoryRow(Base):
    """One trajectory. `payload` is the serialized common.v1.Trajectory as it was put; `reward`
    is the serialized common.v1.Reward and is the truth for the reward (SetReward replaces it
    without rewriting the payload)."""

    __tablename__ = "trajectories"

    id: Mapped[str] = mapped_column(String(TRAJECTORY_ID_CHARS), primary_key=True)
    mode: Mapped[int] = mapped_column(SmallInteger)
    status: Mapped[int] = mapped_column(SmallInteger)
    correct: Mapped[bool | None] = mapped_column(Boolean)
    reward_value: Mapped[float | None] = mapped_column(Float)
    task_source: Mapped[str] = mapped_column(Text)
    split: Mapped[str] = mapped_column(Text)
    run_id: Mapped[str] = mapped_column(Text)
    model_version: Mapped[str] = mapped_column(Text)
    purpose: Mapped[int] = mapped_column(SmallInteger, server_default="0")
    # The reward is a client's verdict (gearshift.rewards.feedback): what training from traffic selects.
    feedback: Mapped[bool] = mapped_column(Boolean, server_default=false())
    # Microseconds since the epoch (UTC): exact, portable keyset paging on both dialects.
    created_at_us: Mapped[int] = mapped_column(BigInteger)
    reward: Mapped[bytes | None] = mapped_column(LargeBinary)
    payload: Mapped[bytes] = mapped_column(LargeBinary)

    # Every equality filter is paired with created_at_us: queries filter, then page newest first.
    __table_args__ = (
        Index(None, "created_at_us", "id"),
        Index(None, "mode", "created_at_us"),
        Index(None, "status", "created_at_us"),
        Index(None, "correct", "created_at_us"),
        Index(None, "reward_value"),
        Index(None, "task_source", "created_at_us"),
        Index(None, "split", "created_at_us"),
        Index(None, "run_id", "created_at_us"),
        Index(None, "model_version", "created_at_us"),
        Index(None, "purpose", "created_at_us"),
        Index(None, "feedback", "created_at_us"),
    )


class CheckpointRow(Base):
    """A trained artefact and where it came from."""

    __tablename__ = "checkpoints"

    id: Mapped[str] = mapped_column(String(CHECKPOINT_ID_CHARS), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    uri: Mapped[str] = mapped_column(Text)
    parent_id: Mapped[str | None] = mapped_column(String(CHECKPOINT_ID_CHARS), ForeignKey("checkpoints.id"))
    job: Mapped[str] = mapped_column(Text)
    config_json: Mapped[str] = mapped_column(Text)
    code_version: Mapped[str] = mapped_column(Text)
    dataset_snapshot: Mapped[str] = mapped_column(Text)
    eval_metrics: Mapped[dict] = mapped_column(JSON)
    status: Mapped[int] = mapped_column(SmallInteger)
    created_at_us: Mapped[int] = mapped_column(BigInteger)
    # When the status was last set (registration, then each UpdateCheckpoint that sets one): the
    # newest PUBLISHED checkpoint is the one published last, so publishing an older one rolls back.
    status_at_us: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        Index(None, "kind", "created_at_us"),
        Index(None, "status", "status_at_us"),
        Index(None, "parent_id"),
    )


class CheckpointTrajectoryRow(Base):
    """Lineage: a checkpoint was trained on these trajectories."""

    __tablename__ = "checkpoint_trajectories"

    checkpoint_id: Mapped[str] = mapped_column(
        String(CHECKPOINT_ID_CHARS), ForeignKey("checkpoints.id", ondelete="CASCADE"), primary_key=True
    )
    trajectory_id: Mapped[str] = mapped_column(
        String(TRAJECTORY_ID_CHARS), ForeignKey("trajectories.id"), primary_key=True
    )

    # "Which checkpoints learned from this trajectory?"
    __table_args__ = (Index(None, "trajectory_id"),)


class JobRunRow(Base):
    """One orchestration task run (score, snapshot, train, evaluate, publish, round), keyed by
    its dedupe key so a task delivered twice finds its own record and does its work once."""

    __tablename__ = "job_runs"

    key: Mapped[str] = mapped_column(String(CHECKPOINT_ID_CHARS), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))  # running, succeeded, failed
    params: Mapped[dict] = mapped_column(JSON)
    result: Mapped[dict] = mapped_column(JSON)
    # What the run started outside this database (a Job name, a run directory): found again on a retry.
    external_id: Mapped[str] = mapped_column(Text)
    log: Mapped[str] = mapped_column(Text)
    error: Mapped[str] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(SmallInteger)
    owner: Mapped[str] = mapped_column(Text)
    created_at_us: Mapped[int] = mapped_column(BigInteger)
    heartbeat_at_us: Mapped[int] = mapped_column(BigInteger)
    finished_at_us: Mapped[int | None] = mapped_column(BigInteger)

    __table_args__ = (
        Index(None, "kind", "created_at_us"),
        Index(None, "status", "created_at_us"),
    )


trajectories = TrajectoryRow.__table__
checkpoints = CheckpointRow.__table__
checkpoint_trajectories = CheckpointTrajectoryRow.__table__
job_runs = JobRunRow.__table__
