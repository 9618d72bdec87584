"""Store test helpers: a database per backend (a SQLite file, the session's Postgres database)
and realistic trajectories."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from alembic import command
from gearshift.api.common.v1.common_pb2 import (
    Mode,
    PlanDecision,
    Reward,
    ToolCall,
    ToolResult,
    Trajectory,
    TrajectoryStatus,
    Turn,
)
from gearshift.storage import TrajectoryRepository, create_store_engine, upgrade_to_head
from gearshift.storage.database import WRITE, alembic_config
from gearshift.testing.postgres import scratch_database
from sqlalchemy.engine import make_url

BASE_US = 1_790_000_000_000_000  # 2026-09-21, a fixed "now" for created_at


def libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def migrated_postgres_url(postgres_url: str) -> str:
    engine = create_store_engine(postgres_url, pool_size=1)
    upgrade_to_head(engine)
    engine.dispose()
    return postgres_url


@pytest.fixture(params=["sqlite", "postgres"])
def store_database_url(request, tmp_path) -> str:
    """An empty store database: a fresh SQLite file, or the session's Postgres database with
    its tables emptied."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    url = request.getfixturevalue("migrated_postgres_url")
    with psycopg.connect(libpq(url), autocommit=True) as connection:
        connection.execute("TRUNCATE checkpoint_trajectories, checkpoints, trajectories")
    return url


@pytest.fixture
def repository(store_database_url: str) -> Iterator[TrajectoryRepository]:
    engine = create_store_engine(store_database_url, pool_size=2)
    upgrade_to_head(engine)
    yield TrajectoryRepository(engine)
    engine.dispose()


def make_trajectory(
    *,
    created_us: int | None = BASE_US,
    reward: Reward | None = None,
    turns: int = 2,
    **fields,
) -> Trajectory:
    """An agentic trajectory with a tool call per turn; keyword fields override the defaults."""
    values = {
        "id": str(uuid.uuid4()),
        "query": "What is 17 * 23?",
        "mode": Mode.MODE_AGENTIC,
        "status": TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED,
        "answer": "391",
        "task_source": "gsm",
        "split": "train",
        "run_id": "run-1",
        "model_version": "base",
        **fields,
    }
    trajectory = Trajectory(**values)
    for index in range(turns):
        call = ToolCall(id=f"{index}", name="python", arguments_json='{"code": "print(17 * 23)"}')
        trajectory.turns.append(
            Turn(
                index=index,
                plan_decision=PlanDecision.PLAN_DECISION_ACT,
                output=f"<tool_call>{{'id': {index}, 'name': 'python'}}</tool_call>",
                tool_calls=[call],
                tool_results=[ToolResult(call_id=call.id, name="python", output="391\n", wall_seconds=0.01)],
            )
        )
    if created_us is not None:
        trajectory.created_at.FromMicroseconds(created_us)
    if reward is not None:
        trajectory.reward.CopyFrom(reward)
    return trajectory


def migrate(engine: sa.Engine, revision: str, down: bool = False) -> None:
    config = alembic_config()
    with engine.connect() as connection:
        config.attributes["connection"] = connection.execution_options(**{WRITE: True})
        (command.downgrade if down else command.upgrade)(config, revision)
        connection.commit()


@pytest.fixture(params=["sqlite", "postgres"])
def empty_database(request, tmp_path) -> Iterator[str]:
    """A database no migration has run on yet (its own, on Postgres: the shared one is at head)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    with scratch_database("gearshift_migration") as url:
        yield url
