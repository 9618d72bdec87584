"""Run only by tests/isolation/test_workers.py, as `pytest -n 2` in a process of its own: one test
on each xdist worker, at the same time, each starting the store service on its worker's Postgres
database, writing a row, a Redis key and files, then, once both have written, reading back only
its own. GEARSHIFT_ISOLATION_PROBE names the folder where the two leave what they used."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
import redis
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.settings import Settings

from tests.libs.storage.helpers import make_trajectory, migrated_postgres_url  # noqa: F401

SHARED = Path(os.environ.get("GEARSHIFT_ISOLATION_PROBE", "."))
BOTH_SECONDS = 120


async def both_written() -> list[dict]:
    deadline = time.monotonic() + BOTH_SECONDS
    while len(found := sorted(SHARED.glob("gw*.json"))) < 2:
        assert time.monotonic() < deadline, "the other worker never wrote: the two tests did not run at once on two workers"
        await asyncio.sleep(0.1)
    return [json.loads(path.read_text()) for path in found]


@pytest.mark.parametrize("side", ["a", "b"])
async def test_a_worker_reads_back_only_what_it_wrote(side, migrated_postgres_url, tmp_path):  # noqa: F811
    worker = os.environ["PYTEST_XDIST_WORKER"]
    settings = Settings(database_url=migrated_postgres_url, metrics_port=0, log_level="WARNING")  # data dir, Redis: the worker's
    async with embedded(settings, ("store",)) as platform, channel(platform.settings.store_addr, settings) as ch:
        store = store_pb2_grpc.TrajectoryStoreStub(ch)
        await store.Put(store_pb2.PutRequest(trajectories=[make_trajectory(query=worker)]))
        keys = redis.Redis.from_url(settings.redis_url)
        keys.set("isolation-probe", worker)
        for folder in (settings.data_dir, tmp_path):
            (folder / "isolation-probe").write_text(worker)
        used = {"worker": worker, "store": platform.settings.store_addr, "database": migrated_postgres_url,
                "redis": settings.redis_url, "data_dir": str(settings.data_dir), "tmp": str(tmp_path)}
        (SHARED / f"{worker}.json").write_text(json.dumps(used))
        both = await both_written()
        rows = (await store.Query(store_pb2.QueryRequest(page_size=100))).trajectories
        assert [row.query for row in rows] == [worker]
        assert keys.get("isolation-probe") == worker.encode()
        keys.delete("isolation-probe")
    assert all((folder / "isolation-probe").read_text() == worker for folder in (settings.data_dir, tmp_path))
    mine, other = sorted(both, key=lambda used: used["worker"] != worker)
    assert all(mine[what] != other[what] for what in ("store", "database", "redis", "data_dir", "tmp")), both
