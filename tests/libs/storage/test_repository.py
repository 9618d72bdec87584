"""TrajectoryRepository and the shipped migrations, on a SQLite file and on Postgres."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from gearshift.api.common.v1.common_pb2 import Checkpoint, Reward
from gearshift.errors import AlreadyExists, NotFound
from gearshift.storage import Keyset, TrajectoryFilter, TrajectoryRepository, upgrade_to_head
from gearshift.storage.database import alembic_config
from gearshift.storage.models import Base
from gearshift.storage.repository import Correctness
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from tests.libs.storage.helpers import BASE_US, make_trajectory


def test_migrations_build_exactly_the_models(repository: TrajectoryRepository):
    with repository.engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
        version = connection.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
    assert differences == []
    assert version == ScriptDirectory.from_config(alembic_config()).get_current_head()
    upgrade_to_head(repository.engine)  # a second start-up changes nothing
    with repository.engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM alembic_version")).scalar_one() == 1


def test_put_counts_only_new_ids(repository: TrajectoryRepository):
    first, second = make_trajectory(), make_trajectory()
    assert repository.put([first, second, first]) == 2  # a repeat inside one batch is skipped too
    assert repository.put([second, make_trajectory()]) == 1
    assert repository.count() == 3
    assert repository.get(first.id) == first
    assert repository.get("00000000-0000-0000-0000-000000000000") is None


# A row the database itself refuses, in the middle of a batch: a trigger on run_id.
REFUSE_POISON = {
    "sqlite": ["CREATE TRIGGER refuse_poison BEFORE INSERT ON trajectories WHEN NEW.run_id = 'poison'"
               " BEGIN SELECT RAISE(ABORT, 'poisoned row'); END"],
    "postgresql": [
        "CREATE FUNCTION refuse_poison() RETURNS trigger AS $$ BEGIN"
        " IF NEW.run_id = 'poison' THEN RAISE EXCEPTION 'poisoned row'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON trajectories FOR EACH ROW EXECUTE FUNCTION refuse_poison()",
    ],
}
DROP_POISON = {"sqlite": ["DROP TRIGGER refuse_poison"],
               "postgresql": ["DROP TRIGGER refuse_poison ON trajectories", "DROP FUNCTION refuse_poison()"]}


def test_a_batch_the_database_refuses_stores_nothing(repository: TrajectoryRepository):
    dialect = repository.engine.dialect.name
    with repository.engine.begin() as connection:
        for statement in REFUSE_POISON[dialect]:
            connection.exec_driver_sql(statement)
    try:
        with pytest.raises(DBAPIError, match="poisoned row"):
            repository.put([make_trajectory(), make_trajectory(run_id="poison"), make_trajectory()])
        assert repository.count() == 0  # rolled back, and the connection went back to the pool clean
        assert repository.put([make_trajectory()]) == 1
    finally:
        with repository.engine.begin() as connection:
            for statement in DROP_POISON[dialect]:
                connection.exec_driver_sql(statement)


def test_keyset_paging_breaks_ties_by_id(repository: TrajectoryRepository):
    batch = [make_trajectory(created_us=BASE_US + i // 3) for i in range(10)]  # three share each time
    repository.put(batch)
    expected = sorted(batch, key=lambda t: (t.created_at.ToMicroseconds(), t.id))
    seen, after = [], None
    while page := repository.query(TrajectoryFilter(), 3, after, newest_first=False):
        seen += page
        after = Keyset.of(page[-1])
    assert [t.id for t in seen] == [t.id for t in expected]
    newest = repository.query(TrajectoryFilter(), 4)
    assert [t.id for t in newest] == [t.id for t in reversed(expected)][:4]
    assert all(len(t.turns) == 0 for t in newest)


def test_set_reward_replaces_reward_and_filter_columns(repository: TrajectoryRepository):
    scored = make_trajectory(reward=Reward(value=1.0, correct=True, kind="correctness"))
    repository.put([scored])
    repository.set_reward(scored.id, Reward(value=0.2, correct=False, kind="sr2am"))
    assert repository.get(scored.id).reward == Reward(value=0.2, correct=False, kind="sr2am")
    assert repository.count(TrajectoryFilter(correctness=Correctness.CORRECT)) == 0
    assert repository.count(TrajectoryFilter(correctness=Correctness.INCORRECT, max_reward=0.2)) == 1
    with pytest.raises(NotFound):
        repository.set_reward("00000000-0000-0000-0000-000000000000", Reward(value=1.0))


def test_checkpoint_lineage_is_all_or_nothing(repository: TrajectoryRepository):
    trained_on = make_trajectory()
    repository.put([trained_on])
    repository.register_checkpoint(Checkpoint(id="base", kind="policy", uri="/ckpt/base", status=1), BASE_US)
    unknown = "00000000-0000-0000-0000-000000000000"
    with pytest.raises(NotFound, match="1 lineage trajectories"):
        repository.register_checkpoint(
            Checkpoint(id="sft-1", kind="policy", uri="/x", parent_id="base", trajectory_ids=[trained_on.id, unknown], status=1),
            BASE_US + 1,
        )
    assert repository.get_checkpoint("sft-1") is None
    child = Checkpoint(id="sft-1", kind="policy", uri="/x", parent_id="base", trajectory_ids=[trained_on.id], status=1)
    repository.register_checkpoint(child, BASE_US + 1)
    with pytest.raises(AlreadyExists, match="trajectory_ids"):
        repository.register_checkpoint(Checkpoint(id="sft-1", kind="policy", uri="/x", parent_id="base", status=1), BASE_US + 2)
    stored = repository.get_checkpoint("sft-1", include_lineage=True)
    assert (stored.parent_id, list(stored.trajectory_ids)) == ("base", [trained_on.id])


def test_concurrent_read_then_write_transactions_wait_instead_of_failing(repository: TrajectoryRepository):
    """On SQLite a deferred transaction that reads before it writes fails with 'database is
    locked' under concurrency; the store's writers start with BEGIN IMMEDIATE instead."""
    repository.register_checkpoint(Checkpoint(id="c", kind="policy", uri="/c", status=1), BASE_US)

    def bump(index: int) -> None:
        repository.update_checkpoint("c", 0, {f"m{index}": float(index)}, at_us=0)

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(bump, range(24)))
    assert repository.get_checkpoint("c").eval_metrics == {f"m{i}": float(i) for i in range(24)}
