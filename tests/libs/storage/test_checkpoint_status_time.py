"""Migration 0005 and what it is for: the newest PUBLISHED checkpoint is the one published last,
so publishing an older one again rolls serving back to it (SQLite and Postgres)."""

from __future__ import annotations

import sqlalchemy as sa
from gearshift.api.common.v1.common_pb2 import Checkpoint, CheckpointStatus
from gearshift.storage import TrajectoryRepository, create_store_engine
from gearshift.storage.codec import checkpoint_row

from tests.libs.storage.helpers import BASE_US, migrate

PUBLISHED = CheckpointStatus.CHECKPOINT_STATUS_PUBLISHED


def test_migration_0005_dates_each_status_from_registration_then_from_each_update(empty_database: str):
    engine = create_store_engine(empty_database, pool_size=1)
    try:
        migrate(engine, "0004")
        with engine.begin() as connection:
            old = sa.Table("checkpoints", sa.MetaData(), autoload_with=connection)
            assert "status_at_us" not in old.c
            rows = [checkpoint_row(Checkpoint(id=f"router-v{n}", kind="router", uri="/r", job="router", status=PUBLISHED), BASE_US + n)
                    for n in (1, 2)]
            connection.execute(sa.insert(old), [{k: v for k, v in row.items() if k in old.c} for row in rows])
        migrate(engine, "head")
        repository = TrajectoryRepository(engine)

        def newest_published() -> str:
            return repository.list_checkpoints(kind="router", status=PUBLISHED, limit=1)[0].id

        assert newest_published() == "router-v2"  # backfilled from the registration times
        repository.update_checkpoint("router-v1", PUBLISHED, {}, at_us=BASE_US + 10)
        assert newest_published() == "router-v1"  # published again: served again
        assert [c.id for c in repository.list_checkpoints(kind="router")] == ["router-v2", "router-v1"]  # unfiltered: by registration
        repository.update_checkpoint("router-v2", 0, {"accuracy": 0.5}, at_us=BASE_US + 20)  # metrics only: no new status time
        assert newest_published() == "router-v1"
    finally:
        engine.dispose()
