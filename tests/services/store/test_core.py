"""TrajectoryStore directly, without gRPC: database work stays off the event loop, and a
database that cannot be reached is UNAVAILABLE rather than an internal error."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest
from gearshift.errors import Unavailable
from gearshift.services.store.core import TrajectoryStore
from gearshift.settings import Settings
from gearshift.storage import TrajectoryRepository, create_store_engine, upgrade_to_head

from tests.libs.storage.helpers import libpq, make_trajectory


async def test_a_blocked_query_does_not_block_the_event_loop(settings: Settings, migrated_postgres_url: str):
    engine = create_store_engine(migrated_postgres_url, pool_size=2)
    upgrade_to_head(engine)
    store = TrajectoryStore(TrajectoryRepository(engine), settings.limits, settings.store)
    trajectory = make_trajectory()
    await store.put([trajectory])
    with psycopg.connect(libpq(migrated_postgres_url)) as locker:
        locker.execute("LOCK TABLE trajectories IN ACCESS EXCLUSIVE MODE")  # every read now waits
        # Released from another thread, so a store that blocked the loop fails here instead of hanging.
        release = threading.Timer(1.0, locker.rollback)
        release.start()
        pending = asyncio.create_task(store.get(trajectory.id))
        started = time.monotonic()
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert time.monotonic() - started < 0.9  # the loop kept running ...
        assert not pending.done()  # ... while the read waited on the lock
        assert (await asyncio.wait_for(pending, 10)).id == trajectory.id
        release.join()
    await store.close()


async def test_an_unreachable_database_is_unavailable(settings: Settings):
    engine = create_store_engine("postgresql+psycopg://postgres@127.0.0.1:1/nowhere", pool_size=1)
    store = TrajectoryStore(TrajectoryRepository(engine), settings.limits, settings.store)
    with pytest.raises(Unavailable):
        await store.put([make_trajectory()])
    await store.close()
