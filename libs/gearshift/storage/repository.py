"""TrajectoryRepository: every read and write of the store, transport-free and synchronous
(the service runs it on worker threads). One short transaction per call."""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, func, insert, select, tuple_, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.dialects import postgresql, sqlite

from gearshift.api.common.v1.common_pb2 import Checkpoint, Reward, Trajectory
from gearshift.errors import AlreadyExists, NotFound
from gearshift.storage.codec import (
    checkpoint_from_row,
    checkpoint_row,
    microseconds,
    reward_columns,
    trajectory_from_row,
    trajectory_row,
)
from gearshift.storage.database import WRITE
from gearshift.storage.models import checkpoint_trajectories, checkpoints, trajectories

ID_CHUNK = 1_000  # ids per IN (...) list: far below every dialect's parameter limit


class Correctness(enum.Enum):
    """Which reward verdicts a filter accepts."""

    ANY = "any"
    CORRECT = "correct"
    INCORRECT = "incorrect"
    UNSCORED = "unscored"


@dataclass(frozen=True)
class TrajectoryFilter:
    """Selects trajectories; empty or None fields do not filter. Times are microseconds since
    the epoch, created_after inclusive and created_before exclusive."""

    modes: tuple[int, ...] = ()
    statuses: tuple[int, ...] = ()
    purposes: tuple[int, ...] = ()
    correctness: Correctness = Correctness.ANY
    min_reward: float | None = None
    max_reward: float | None = None
    task_source: str = ""
    model_version: str = ""
    run_id: str = ""
    split: str = ""
    created_after_us: int | None = None
    created_before_us: int | None = None
    feedback_only: bool = False  # only rewards that are a client's verdict (gearshift.rewards.feedback)


@dataclass(frozen=True)
class Keyset:
    """A position in (created_at, id) order: paging continues strictly past it."""

    created_at_us: int
    id: str

    @classmethod
    def of(cls, trajectory: Trajectory) -> Keyset:
        return cls(microseconds(trajectory.created_at), trajectory.id)


def _conditions(flt: TrajectoryFilter) -> list:
    t = trajectories.c
    where = []
    if flt.modes:
        where.append(t.mode.in_(flt.modes))
    if flt.statuses:
        where.append(t.status.in_(flt.statuses))
    if flt.purposes:
        where.append(t.purpose.in_(flt.purposes))
    if flt.correctness is Correctness.CORRECT:
        where.append(t.correct.is_(True))
    elif flt.correctness is Correctness.INCORRECT:
        where.append(t.correct.is_(False))
    elif flt.correctness is Correctness.UNSCORED:
        where.append(t.reward.is_(None))
    if flt.min_reward is not None:
        where.append(t.reward_value >= flt.min_reward)
    if flt.max_reward is not None:
        where.append(t.reward_value <= flt.max_reward)
    for column in ("task_source", "model_version", "run_id", "split"):
        value = getattr(flt, column)
        if value:
            where.append(t[column] == value)
    if flt.created_after_us is not None:
        where.append(t.created_at_us >= flt.created_after_us)
    if flt.created_before_us is not None:
        where.append(t.created_at_us < flt.created_before_us)
    if flt.feedback_only:
        where.append(t.feedback.is_(True))
    return where


# The columns a training job writes and a retry of it writes again. Status is left out (a
# checkpoint may have been promoted since), and so is created_at (the store's, not the job's).
CHECKPOINT_CONTENT = ("kind", "uri", "parent_id", "job", "config_json", "code_version", "dataset_snapshot")


def _first_difference(
    stored: Mapping[str, Any], stored_lineage: list[str], row: Mapping[str, Any], lineage: list[str]
) -> str | None:
    """The first field in which a registration differs from the stored checkpoint of its id;
    None when it is a retry. The stored checkpoint may hold more metrics than the registration
    (evaluation adds them), but each metric the registration carries must match."""
    for column in CHECKPOINT_CONTENT:
        if stored[column] != row[column]:
            return column
    if set(stored_lineage) != set(lineage):
        return "trajectory_ids"
    for name, value in row["eval_metrics"].items():
        if stored["eval_metrics"].get(name) != value:
            return f"eval_metrics[{name}]"
    return None


class TrajectoryRepository:
    """Reads and writes trajectories and checkpoints on a Postgres or SQLite engine."""

    def __init__(self, engine: Engine):
        self.engine = engine
        dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
        # INSERT ... ON CONFLICT DO NOTHING: duplicates are skipped inside the database, and
        # the summed row count of the executemany says how many were new. Without RETURNING,
        # psycopg pipelines one small prepared statement per row, which parses and binds far
        # faster than the giant multi-row VALUES statements RETURNING would need. Every episode
        # ends with a Put, so the statement is compiled once and runs on the DB-API cursor:
        # SQLAlchemy's execution layer cost more than SQLite's own insert (one row in 0.42-0.57
        # against 0.23-0.29 ms, each call starting cold as an episode's does).
        compiled = dialect.insert(trajectories).on_conflict_do_nothing(index_elements=["id"]).compile(dialect=engine.dialect)
        self._insert_trajectories = str(compiled)
        self._insert_order = compiled.positiontup  # SQLite's "?" parameters go by position
        self._insert_checkpoint = (
            dialect.insert(checkpoints).on_conflict_do_nothing(index_elements=["id"]).returning(checkpoints.c.id)
        )

    @contextlib.contextmanager
    def _writing(self) -> Iterator[Connection]:
        with self.engine.connect() as connection:
            connection.execution_options(**{WRITE: True})
            with connection.begin():
                yield connection

    @contextlib.contextmanager
    def _driver_writing(self) -> Iterator[Any]:
        """A DB-API cursor in a write transaction on a pooled connection. Driver errors come out
        as SQLAlchemy's, as they do from _writing."""
        dbapi = self.engine.dialect.loaded_dbapi
        try:
            connection = self.engine.raw_connection()
            try:
                cursor = connection.cursor()
                if self.engine.dialect.name == "sqlite":
                    cursor.execute("BEGIN IMMEDIATE")  # its connections run in autocommit (database.py)
                yield cursor
                connection.commit()
            finally:
                connection.close()  # back to the pool, which rolls back what was not committed
        except dbapi.Error as exc:
            raise DBAPIError.instance(None, None, exc, dbapi.Error) from exc

    # trajectories

    def put(self, batch: Sequence[Trajectory]) -> int:
        """Stores a batch in one transaction; returns how many ids were new."""
        if not batch:
            return 0
        rows = [trajectory_row(trajectory) for trajectory in batch]
        if self._insert_order:
            rows = [tuple(row[key] for key in self._insert_order) for row in rows]
        with self._driver_writing() as cursor:
            cursor.executemany(self._insert_trajectories, rows)
            return cursor.rowcount

    def get(self, trajectory_id: str) -> Trajectory | None:
        stmt = select(trajectories.c.payload, trajectories.c.reward).where(trajectories.c.id == trajectory_id)
        with self.engine.connect() as connection:
            row = connection.execute(stmt).first()
        return None if row is None else trajectory_from_row(row.payload, row.reward, include_turns=True)

    def query(
        self,
        flt: TrajectoryFilter,
        limit: int,
        after: Keyset | None = None,
        include_turns: bool = False,
        newest_first: bool = True,
    ) -> list[Trajectory]:
        """Up to `limit` matching trajectories in (created_at, id) order, strictly past `after`."""
        t = trajectories.c
        key = tuple_(t.created_at_us, t.id)
        stmt = select(t.payload, t.reward).where(*_conditions(flt))
        if after is not None:
            position = tuple_(after.created_at_us, after.id)
            stmt = stmt.where(key < position if newest_first else key > position)
        order = (t.created_at_us.desc(), t.id.desc()) if newest_first else (t.created_at_us, t.id)
        stmt = stmt.order_by(*order).limit(limit)
        with self.engine.connect() as connection:
            rows = connection.execute(stmt).all()
        return [trajectory_from_row(row.payload, row.reward, include_turns) for row in rows]

    def count(self, flt: TrajectoryFilter = TrajectoryFilter()) -> int:
        stmt = select(func.count()).select_from(trajectories).where(*_conditions(flt))
        with self.engine.connect() as connection:
            return connection.execute(stmt).scalar_one()

    def set_reward(self, trajectory_id: str, reward: Reward) -> Reward | None:
        """Replaces a trajectory's reward and its filter columns; returns the reward it replaced
        (None when there was none). NotFound for an unknown id.

        Read and write are one transaction holding the row (Postgres: FOR UPDATE; SQLite: BEGIN
        IMMEDIATE, one writer at a time), so of two verdicts racing, the second reports the
        first as what it replaced: none is lost between them."""
        t = trajectories.c
        with self._writing() as connection:
            current = connection.execute(select(t.reward).where(t.id == trajectory_id).with_for_update()).first()
            if current is None:
                raise NotFound(f"trajectory {trajectory_id} not found")
            connection.execute(update(trajectories).where(t.id == trajectory_id).values(**reward_columns(reward)))
        return None if current.reward is None else Reward.FromString(current.reward)

    # checkpoints

    def register_checkpoint(self, checkpoint: Checkpoint, created_at_us: int) -> Checkpoint:
        """Records a checkpoint and its lineage in one transaction; NotFound when the parent or
        a lineage trajectory is unknown. A reused id is a retry when the content matches (see
        _first_difference): the stored checkpoint comes back, as it is now, and nothing is
        written. Otherwise AlreadyExists, naming the first field that differs."""
        lineage = list(dict.fromkeys(checkpoint.trajectory_ids))
        with self._writing() as connection:
            if checkpoint.parent_id and not self._checkpoint_exists(connection, checkpoint.parent_id):
                raise NotFound(f"parent checkpoint {checkpoint.parent_id} not found")
            missing = self._missing_trajectories(connection, lineage)
            if missing:
                shown = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
                raise NotFound(f"{len(missing)} lineage trajectories not found: {shown}")
            row = checkpoint_row(checkpoint, created_at_us)
            if connection.execute(self._insert_checkpoint, row).first() is None:
                # Compared in the insert's transaction, so the row it met has committed, with
                # its lineage (Postgres's insert waits for the other writer, SQLite runs one
                # writer at a time); lineage never changes after that.
                return self._registered_before(connection, row, lineage)
            if lineage:
                links = [{"checkpoint_id": checkpoint.id, "trajectory_id": tid} for tid in lineage]
                connection.execute(insert(checkpoint_trajectories), links)
        return checkpoint_from_row(row)

    def get_checkpoint(self, checkpoint_id: str, include_lineage: bool = False) -> Checkpoint | None:
        with self.engine.connect() as connection:
            row = connection.execute(select(checkpoints).where(checkpoints.c.id == checkpoint_id)).first()
            if row is None:
                return None
            lineage = self._lineage(connection, checkpoint_id) if include_lineage else None
        return checkpoint_from_row(row._mapping, lineage)

    def list_checkpoints(self, kind: str = "", status: int = 0, limit: int = 100) -> list[Checkpoint]:
        """Newest first; with a status, the one given it last first (the newest PUBLISHED is the
        one published last); empty kind and status 0 do not filter."""
        c = checkpoints.c
        stmt = select(checkpoints)
        if kind:
            stmt = stmt.where(c.kind == kind)
        if status:
            stmt = stmt.where(c.status == status)
        newest = c.status_at_us if status else c.created_at_us
        stmt = stmt.order_by(newest.desc(), c.id.desc()).limit(limit)
        with self.engine.connect() as connection:
            return [checkpoint_from_row(row._mapping) for row in connection.execute(stmt)]

    def update_checkpoint(self, checkpoint_id: str, status: int, metrics: dict[str, float], at_us: int) -> Checkpoint:
        """Sets the status (0 leaves it), stamped at_us even when it is the same: publishing a
        checkpoint again makes it the newest published. Merges metrics. NotFound for an unknown id."""
        c = checkpoints.c
        with self._writing() as connection:
            current = connection.execute(
                select(c.status, c.eval_metrics).where(c.id == checkpoint_id).with_for_update()
            ).first()
            if current is None:
                raise NotFound(f"checkpoint {checkpoint_id} not found")
            merged = {**current.eval_metrics, **metrics}
            values = {"eval_metrics": merged, "status": status or current.status}
            if status:
                values["status_at_us"] = at_us
            connection.execute(update(checkpoints).where(c.id == checkpoint_id).values(**values))
            row = connection.execute(select(checkpoints).where(c.id == checkpoint_id)).one()
        return checkpoint_from_row(row._mapping)

    def _registered_before(self, connection: Connection, row: dict[str, Any], lineage: list[str]) -> Checkpoint:
        """The stored checkpoint with row's id when row and lineage are a retry of it."""
        stored = connection.execute(select(checkpoints).where(checkpoints.c.id == row["id"])).one()._mapping
        field = _first_difference(stored, self._lineage(connection, row["id"]), row, lineage)
        if field:
            raise AlreadyExists(f"checkpoint {row['id']} already exists with a different {field}")
        return checkpoint_from_row(stored)

    def _checkpoint_exists(self, connection: Connection, checkpoint_id: str) -> bool:
        return connection.execute(select(checkpoints.c.id).where(checkpoints.c.id == checkpoint_id)).first() is not None

    def _missing_trajectories(self, connection: Connection, ids: list[str]) -> list[str]:
        found: set[str] = set()
        for start in range(0, len(ids), ID_CHUNK):
            chunk = ids[start : start + ID_CHUNK]
            found.update(connection.execute(select(trajectories.c.id).where(trajectories.c.id.in_(chunk))).scalars())
        return [tid for tid in ids if tid not in found]

    def _lineage(self, connection: Connection, checkpoint_id: str) -> list[str]:
        link = checkpoint_trajectories.c
        stmt = select(link.trajectory_id).where(link.checkpoint_id == checkpoint_id).order_by(link.trajectory_id)
        return list(connection.execute(stmt).scalars())
