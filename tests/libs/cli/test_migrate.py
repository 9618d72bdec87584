"""`gearshift migrate` and `gearshift serve store` as the chart runs them, real processes on a
real database (a SQLite file, a Postgres database of each test's own): the migration brings a
database from the first schema to this version's without losing a row, and a store told not to
migrate at start-up refuses, in one line, a schema that is not its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from gearshift.api.common.v1.common_pb2 import Checkpoint, CheckpointStatus, Reward
from gearshift.storage import TrajectoryFilter, TrajectoryRepository, create_store_engine
from gearshift.storage.codec import trajectory_row

from tests.libs.storage.helpers import BASE_US, empty_database, make_trajectory, migrate  # noqa: F401
from tests.libs.storage.schemas import FIRST, FUTURE, HEAD, UNKNOWN, needs_migrate, stamp, stored_revision

PUBLISHED = CheckpointStatus.CHECKPOINT_STATUS_PUBLISHED

# The tables as migration 0001 created them, written as a store of that version wrote them.
INSERT_TRAJECTORY_0001 = sa.text(
    "INSERT INTO trajectories (id, mode, status, correct, reward_value, task_source, split, run_id, model_version,"
    " created_at_us, reward, payload) VALUES (:id, :mode, :status, :correct, :reward_value, :task_source, :split,"
    " :run_id, :model_version, :created_at_us, :reward, :payload)"
)
INSERT_CHECKPOINT_0001 = sa.text(
    "INSERT INTO checkpoints (id, kind, uri, parent_id, job, config_json, code_version, dataset_snapshot, eval_metrics,"
    " status, created_at_us) VALUES (:id, :kind, :uri, :parent_id, 'grpo', '{}', 'abc123', 'snap-1', :eval_metrics,"
    " :status, :created_at_us)"
)
INSERT_LINEAGE_0001 = sa.text("INSERT INTO checkpoint_trajectories (checkpoint_id, trajectory_id) VALUES (:checkpoint, :trajectory)")


def gearshift(*args: str, url: str, tmp_path: Path, **settings: str) -> subprocess.CompletedProcess:
    """A gearshift command on the database at url, with no other setting from this shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEARSHIFT_")}
    env |= {"GEARSHIFT_DATABASE_URL": url, "GEARSHIFT_DATA_DIR": str(tmp_path), "GEARSHIFT_METRICS_PORT": "0", **settings}
    return subprocess.run([sys.executable, "-m", "gearshift.cli", *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def engine(empty_database: str):
    engine = create_store_engine(empty_database, pool_size=1)
    yield engine
    engine.dispose()


def test_migrate_brings_a_first_schema_database_to_head_losing_no_row(engine: sa.Engine, empty_database: str, tmp_path):
    migrate(engine, "0001")
    trajectories = [make_trajectory(created_us=BASE_US + n) for n in range(5)]
    trajectories.append(make_trajectory(created_us=BASE_US + 5, reward=Reward(value=1.0, correct=True, verifier="feedback")))
    trajectories.append(make_trajectory(created_us=BASE_US + 6, reward=Reward(value=0.0, correct=False, verifier="numeric")))
    columns_0001 = ("id", "mode", "status", "correct", "reward_value", "task_source", "split", "run_id", "model_version",
                    "created_at_us", "reward", "payload")
    with engine.begin() as connection:
        connection.execute(INSERT_TRAJECTORY_0001, [{k: trajectory_row(t)[k] for k in columns_0001} for t in trajectories])
        connection.execute(INSERT_CHECKPOINT_0001, [
            {"id": "policy-v1", "kind": "policy", "uri": "/c/1", "parent_id": None, "eval_metrics": '{"accuracy": 0.5}',
             "status": PUBLISHED, "created_at_us": BASE_US + 10},
            {"id": "policy-v2", "kind": "policy", "uri": "/c/2", "parent_id": "policy-v1", "eval_metrics": '{"accuracy": 0.75}',
             "status": PUBLISHED, "created_at_us": BASE_US + 20},
        ])
        connection.execute(INSERT_LINEAGE_0001, [{"checkpoint": "policy-v2", "trajectory": t.id} for t in trajectories[:3]])

    checked = gearshift("migrate", "--check", url=empty_database, tmp_path=tmp_path)
    assert checked.returncode == 1, checked.stderr
    assert checked.stderr == f"Error: {needs_migrate(FIRST)}\n"
    assert stored_revision(engine) == "0001"  # the check changed nothing

    migrated = gearshift("migrate", url=empty_database, tmp_path=tmp_path)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.splitlines()[1:] == [f"schema was: {FIRST}", f"schema now: {HEAD}"]

    repository = TrajectoryRepository(engine)
    assert repository.count() == len(trajectories)
    assert [repository.get(t.id) for t in trajectories] == trajectories
    assert [t.id for t in repository.query(TrajectoryFilter(feedback_only=True), 10)] == [trajectories[5].id]  # 0004's backfill
    v1, v2 = repository.get_checkpoint("policy-v1"), repository.get_checkpoint("policy-v2", include_lineage=True)
    assert (v1.eval_metrics["accuracy"], v2.eval_metrics["accuracy"], v2.parent_id) == (0.5, 0.75, "policy-v1")
    assert sorted(v2.trajectory_ids) == sorted(t.id for t in trajectories[:3])
    assert [c.id for c in repository.list_checkpoints(status=PUBLISHED)] == ["policy-v2", "policy-v1"]  # 0005's status times

    repository.register_checkpoint(Checkpoint(id="policy-v3", kind="policy", uri="/c/3", parent_id="policy-v2"), BASE_US + 30)
    assert repository.get_checkpoint("policy-v3").parent_id == "policy-v2"  # and the store writes on the new schema


def test_migrate_on_a_current_database_changes_nothing(engine: sa.Engine, empty_database: str, tmp_path):
    first = gearshift("migrate", url=empty_database, tmp_path=tmp_path)
    assert first.returncode == 0 and first.stdout.splitlines()[1:] == ["schema was: empty", f"schema now: {HEAD}"], first.stderr
    TrajectoryRepository(engine).put([make_trajectory()])

    again = gearshift("migrate", url=empty_database, tmp_path=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[1:] == [f"schema was: {HEAD}", f"schema now: {HEAD} (already current: nothing to do)"]
    checked = gearshift("migrate", "--check", url=empty_database, tmp_path=tmp_path)
    assert checked.returncode == 0 and checked.stdout.splitlines()[1:] == [f"schema: {HEAD} (current)"], checked.stderr
    assert TrajectoryRepository(engine).count() == 1


def test_migrate_refuses_a_schema_from_a_newer_release_in_one_line(engine: sa.Engine, empty_database: str, tmp_path):
    migrate(engine, "head")
    stamp(engine, FUTURE)
    for args in (["migrate"], ["migrate", "--check"]):
        refused = gearshift(*args, url=empty_database, tmp_path=tmp_path)
        assert (refused.returncode, refused.stderr) == (1, f"Error: {UNKNOWN}\n")
    assert stored_revision(engine) == FUTURE


@pytest.mark.parametrize("schema", ["old", "newer"])
def test_a_store_that_does_not_migrate_at_start_refuses_another_schema_in_one_line(
    engine: sa.Engine, empty_database: str, tmp_path, schema: str
):
    migrate(engine, "0001" if schema == "old" else "head")
    if schema == "newer":
        stamp(engine, FUTURE)
    store = gearshift("serve", "store", "--port", "0", url=empty_database, tmp_path=tmp_path,
                      GEARSHIFT_STORE__MIGRATE_ON_START="false")
    expected = "store: " + (needs_migrate(FIRST) if schema == "old" else UNKNOWN)
    assert store.returncode == 1, store.stderr
    assert store.stderr.splitlines()[-1] == expected and "Traceback" not in store.stderr
    assert stored_revision(engine) == ("0001" if schema == "old" else FUTURE)
