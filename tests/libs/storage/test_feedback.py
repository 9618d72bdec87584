"""Feedback in the repository: set_reward says what it replaced, with no verdict lost when two
race; the feedback column follows the stored reward and feedback_only filters on it; migration
0004 adds the column and marks the feedback already stored, on SQLite and on Postgres."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import sqlalchemy as sa
from gearshift.api.common.v1.common_pb2 import Reward
from gearshift.rewards.feedback import feedback_verifier
from gearshift.storage import Keyset, TrajectoryFilter, TrajectoryRepository, create_store_engine, upgrade_to_head
from gearshift.storage.codec import trajectory_row
from gearshift.storage.repository import Correctness

from tests.libs.storage.helpers import BASE_US, libpq, make_trajectory, migrate

CLIENT = Reward(value=1.0, correct=True, kind="feedback", verifier=feedback_verifier())
GRADED = Reward(value=0.0, correct=False, kind="feedback", verifier=feedback_verifier("exact"))
SCORED = Reward(value=1.0, correct=True, kind="apo", verifier="phrase")


def test_set_reward_returns_what_it_replaced(repository: TrajectoryRepository):
    trajectory = make_trajectory()
    repository.put([trajectory])
    assert repository.set_reward(trajectory.id, CLIENT) is None  # the first verdict replaced nothing
    assert repository.set_reward(trajectory.id, GRADED) == CLIENT
    assert repository.set_reward(trajectory.id, SCORED) == GRADED
    assert repository.get(trajectory.id).reward == SCORED


def test_the_feedback_column_follows_the_stored_reward(repository: TrajectoryRepository):
    put_with_feedback = make_trajectory(created_us=BASE_US, reward=CLIENT)
    graded_later = make_trajectory(created_us=BASE_US + 1)
    rescored = make_trajectory(created_us=BASE_US + 2, reward=GRADED)
    scored = make_trajectory(created_us=BASE_US + 3, reward=SCORED)
    unscored = make_trajectory(created_us=BASE_US + 4)
    lookalike = make_trajectory(created_us=BASE_US + 5, reward=Reward(value=1.0, correct=True, verifier="feedbacks"))
    repository.put([put_with_feedback, graded_later, rescored, scored, unscored, lookalike])
    repository.set_reward(graded_later.id, GRADED)
    repository.set_reward(rescored.id, SCORED)  # the reward service's score replaced the client's

    feedback = TrajectoryFilter(feedback_only=True)
    newest_first = [graded_later.id, put_with_feedback.id]
    assert [t.id for t in repository.query(feedback, 10)] == newest_first
    assert [t.id for t in repository.query(feedback, 10, newest_first=False)] == newest_first[::-1]
    assert repository.count(TrajectoryFilter(feedback_only=True, correctness=Correctness.CORRECT)) == 1
    # Keyset paging within the filter, one row a page.
    first = repository.query(feedback, 1)
    assert [t.id for t in repository.query(feedback, 1, Keyset.of(first[0]))] == [put_with_feedback.id]
    assert repository.count() == 6


def test_racing_verdicts_each_see_the_one_before(repository: TrajectoryRepository):
    """Many verdicts on one trajectory at once: they take turns, so exactly one replaced nothing
    and every other replaced a distinct one of them; the last one written is the one stored."""
    trajectory = make_trajectory()
    repository.put([trajectory])
    verdicts = [Reward(value=i / 16, correct=bool(i % 2), verifier=feedback_verifier()) for i in range(16)]
    start = threading.Barrier(8)

    def verdict(reward: Reward) -> Reward | None:
        if reward.value < 0.5:
            start.wait()
        return repository.set_reward(trajectory.id, reward)

    with ThreadPoolExecutor(max_workers=8) as pool:
        replaced = list(pool.map(verdict, verdicts))
    assert_a_chain(verdicts, replaced, repository.get(trajectory.id).reward)


def assert_a_chain(written: list[Reward], replaced: list[Reward | None], stored: Reward) -> None:
    """The writes formed one order: one replaced nothing, each other replaced another, each write
    was replaced at most once, and only the stored one by none."""
    assert sum(r is None for r in replaced) == 1
    previous = [r.SerializeToString() for r in replaced if r is not None]
    assert len(set(previous)) == len(written) - 1
    keys = {w.SerializeToString() for w in written}
    assert set(previous) <= keys and keys - set(previous) == {stored.SerializeToString()}


def waiting_on_locks(url: str) -> int:
    with psycopg.connect(libpq(url), autocommit=True) as connection:
        return connection.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()[0]


def test_a_verdict_waiting_behind_another_writer_replaces_what_it_wrote(migrated_postgres_url: str):
    """Postgres, deterministically: a writer holds the row; two verdicts queue behind it. A read
    outside the lock would let both report the reward from before, and lose one."""
    engine = create_store_engine(migrated_postgres_url, pool_size=3)
    repository = TrajectoryRepository(engine)
    trajectory = make_trajectory(reward=SCORED)
    repository.put([trajectory])
    first, second = (Reward(value=v, correct=True, verifier=feedback_verifier()) for v in (0.25, 0.75))
    try:
        with engine.connect() as holder, ThreadPoolExecutor(max_workers=2) as pool:
            holder.execute(sa.text("SELECT id FROM trajectories WHERE id = :id FOR UPDATE"), {"id": trajectory.id})
            queued = [pool.submit(repository.set_reward, trajectory.id, reward) for reward in (first, second)]
            deadline = time.monotonic() + 20
            while waiting_on_locks(migrated_postgres_url) < 2:
                assert time.monotonic() < deadline, "the verdicts never queued on the row"
                time.sleep(0.02)
            holder.commit()
            replaced = [future.result(20) for future in queued]
        stored = repository.get(trajectory.id).reward
        assert SCORED in replaced and stored in (first, second) and stored not in replaced
        assert (first if stored == second else second) in replaced
    finally:
        engine.dispose()


# ---------------------------------------------------------------- migration 0004


def test_migration_0004_marks_the_feedback_already_stored(empty_database: str):
    engine = create_store_engine(empty_database, pool_size=1)
    try:
        migrate(engine, "0003")
        rows = {
            "client": make_trajectory(created_us=BASE_US, reward=CLIENT),
            "graded": make_trajectory(created_us=BASE_US + 1, reward=GRADED),
            "scored": make_trajectory(created_us=BASE_US + 2, reward=SCORED),
            "unscored": make_trajectory(created_us=BASE_US + 3),
        }
        # More scored rows than one backfill chunk, so the chunks follow each other.
        rows |= {f"bulk-{i}": make_trajectory(created_us=BASE_US + 10 + i, reward=CLIENT if i % 3 == 0 else SCORED)
                 for i in range(2_100)}
        with engine.begin() as connection:
            old = sa.Table("trajectories", sa.MetaData(), autoload_with=connection)
            assert "feedback" not in old.c
            columns = set(old.c.keys())
            connection.execute(sa.insert(old), [{k: v for k, v in trajectory_row(t).items() if k in columns}
                                                for t in rows.values()])

        migrate(engine, "head")
        repository = TrajectoryRepository(engine)
        marked = {t.id for t in repository.query(TrajectoryFilter(feedback_only=True), 10_000)}
        expected = {t.id for t in rows.values() if t.reward.verifier.startswith("feedback")}
        assert marked == expected and rows["client"].id in marked and rows["graded"].id in marked
        assert len(expected) == 2 + 700
        assert repository.get(rows["graded"].id) == rows["graded"]  # the rows themselves are untouched
        with engine.connect() as connection:
            indexes = {ix["name"] for ix in sa.inspect(connection).get_indexes("trajectories")}
        assert "ix_trajectories_feedback_created_at_us" in indexes

        migrate(engine, "0003", down=True)
        with engine.connect() as connection:
            assert "feedback" not in {c["name"] for c in sa.inspect(connection).get_columns("trajectories")}
            assert connection.execute(sa.text("SELECT count(*) FROM trajectories")).scalar_one() == len(rows)
        upgrade_to_head(engine)
        assert repository.count(TrajectoryFilter(feedback_only=True)) == len(expected)
    finally:
        engine.dispose()
