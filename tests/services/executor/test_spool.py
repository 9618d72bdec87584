"""The executor's spool (services/executor/spool.py) on real files, and its replay into the real
store (durable_store.py): oldest first, nothing twice, a refused or damaged file set aside."""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import TrajectoryStatus
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.services.executor.durable_store import DurableStore
from gearshift.services.executor.spool import REFUSED_DIR, STALE_TEMP_SECONDS, Spool
from prometheus_client import REGISTRY
from pydantic import SecretStr

from tests.libs.storage.helpers import make_trajectory


def sample(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_spooled_trajectories_outlive_the_process_and_come_back_oldest_first(tmp_path):
    first = Spool(tmp_path)
    written = [make_trajectory() for _ in range(3)]
    for trajectory in written:
        await first.append(trajectory)
    await first.append(written[0])  # already waiting: not a second entry
    assert len(first) == 3 and sample("gearshift_executor_spool_depth") == 3

    again = Spool(tmp_path)  # a restarted executor
    assert [entry.trajectory_id for entry in again.oldest(10)] == [t.id for t in written]
    assert [t for _, t in await again.read(again.oldest(10), max_bytes=1)] == [written[0]]  # at least one, however large
    assert [t for _, t in await again.read(again.oldest(10), max_bytes=1 << 20)] == written
    assert await again.trajectory(written[1].id) == written[1] and await again.trajectory(str(uuid.uuid4())) is None

    later = make_trajectory()
    await again.append(later)  # its sequence continues after the newest on disk
    await again.remove(again.oldest(1))
    assert [entry.trajectory_id for entry in Spool(tmp_path).oldest(10)] == [written[1].id, written[2].id, later.id]


async def test_a_write_leaves_only_whole_files_and_a_crashed_write_is_cleared(tmp_path):
    stale, fresh = tmp_path / ".000000000007-x.trajectory.1.tmp", tmp_path / ".000000000008-y.trajectory.2.tmp"
    stale.write_bytes(b"half a trajec")
    fresh.write_bytes(b"being written")
    os.utime(stale, (time.time() - STALE_TEMP_SECONDS - 1,) * 2)
    spool = Spool(tmp_path)
    assert len(spool) == 0 and not stale.exists() and fresh.exists()  # another writer's may still be renamed
    await spool.append(make_trajectory())
    (entry,) = spool.oldest(5)
    assert sorted(path.name for path in tmp_path.iterdir()) == [fresh.name, entry.path.name]


async def test_a_spool_left_by_a_previous_run_is_replayed_into_the_store_once_and_a_refused_one_set_aside(settings, postgres_url):
    source = f"spool-{uuid.uuid4().hex[:8]}"
    stored_before, refused, waiting = (make_trajectory(task_source=source, created_us=None) for _ in range(3))
    refused.status = TrajectoryStatus.TRAJECTORY_STATUS_UNSPECIFIED  # the store refuses it as invalid
    spool_dir = settings.data_dir / "left-behind"  # the spool volume; the executor that wrote there is gone
    spool = Spool(spool_dir / "executor-gone")
    for trajectory in (stored_before, refused, waiting):
        await spool.append(trajectory)
    damaged_id = str(uuid.uuid4())
    (spool.directory / f"{999:012d}-{damaged_id}.trajectory").write_bytes(b"\xff\xff not a trajectory")
    before = {event: sample("gearshift_executor_spool_trajectories_total", event=event) for event in ("replayed", "refused")}
    counted = sample("gearshift_executor_episodes_total", mode="agentic", strategy="unspecified", status="completed")

    executor = settings.executor.model_copy(update={"spool_dir": spool_dir})
    base = settings.model_copy(update={"database_url": postgres_url, "executor": executor})
    async with embedded(base, services=["store"]) as store_only:
        async with channel(store_only.settings.store_addr, store_only.settings) as ch:
            stub = store_pb2_grpc.TrajectoryStoreStub(ch)
            # The previous run crashed after the store took this one and before its file was deleted.
            await stub.Put(store_pb2.PutRequest(trajectories=[stored_before]))
            async with embedded(store_only.settings, services=["executor"]):
                for _ in range(100):
                    if not list(spool_dir.glob("*/*.trajectory")):  # taken over, then replayed or set aside
                        break
                    await asyncio.sleep(0.1)
            stored = [t async for t in stub.Export(store_pb2.ExportRequest(filter=store_pb2.TrajectoryFilter(task_source=source)))]

    assert sorted(t.id for t in stored) == sorted([stored_before.id, waiting.id])  # each once
    set_aside = spool_dir.glob(f"*/{REFUSED_DIR}/*.trajectory")  # in the directory of the executor that took them over
    assert sorted(path.name.partition("-")[2] for path in set_aside) == sorted(f"{i}.trajectory" for i in (refused.id, damaged_id))
    assert sample("gearshift_executor_spool_trajectories_total", event="replayed") == before["replayed"] + 2
    assert sample("gearshift_executor_spool_trajectories_total", event="refused") == before["refused"] + 1
    assert sample("gearshift_executor_episodes_total", mode="agentic", strategy="unspecified", status="completed") == counted + 2


async def test_under_a_steady_stream_of_new_trajectories_the_spool_empties_and_the_store_takes_them_directly_again(settings, postgres_url, tmp_path):
    """New trajectories join a spool that is not empty; were they to keep joining it while the
    replay puts its last entries, a steady stream would keep it from ever emptying."""
    source = f"steady-{uuid.uuid4().hex[:8]}"
    spool = Spool(tmp_path / "spool")
    for _ in range(200):
        await spool.append(make_trajectory(task_source=source, created_us=None))
    base = settings.model_copy(update={"database_url": postgres_url})
    async with embedded(base, services=["store"]) as store_only, channel(store_only.settings.store_addr, store_only.settings) as ch:
        stub = store_pb2_grpc.TrajectoryStoreStub(ch)
        durable = DurableStore(stub, spool, settings.executor)
        stop, outcomes = asyncio.Event(), []

        async def arrivals() -> None:
            while not stop.is_set():
                outcomes.append(await durable.put(make_trajectory(task_source=source, created_us=None)))
                await asyncio.sleep(0.001)

        streams = [asyncio.create_task(arrivals()) for _ in range(8)]
        durable.start()
        emptied = False
        for _ in range(100):
            if not len(spool):
                emptied = True
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.gather(*streams)
        await durable.close()
        stored = [t.id async for t in stub.Export(store_pb2.ExportRequest(filter=store_pb2.TrajectoryFilter(task_source=source)))]

    assert emptied and not len(spool) and outcomes[-1] is True  # stored directly again
    assert False in outcomes  # some arrived while the spool held entries and joined it
    assert len(stored) == len(set(stored)) == 200 + len(outcomes)


async def test_a_store_that_does_not_accept_the_caller_keeps_the_trajectory_in_the_spool_and_an_invalid_one_fails(settings, postgres_url, tmp_path):
    """Only a trajectory the store refuses as invalid fails its episode (a spooled copy would be
    refused too); any other failure of the store's keeps it, here a token it does not accept."""
    store_settings = settings.model_copy(update={"database_url": postgres_url, "auth_token": SecretStr("the-store-s-token")})
    async with embedded(store_settings, services=["store"]) as store_only:
        caller = store_only.settings.model_copy(update={"auth_token": SecretStr("another-token")})
        async with channel(store_only.settings.store_addr, caller) as ch:
            durable = DurableStore(store_pb2_grpc.TrajectoryStoreStub(ch), Spool(tmp_path / "spool"), settings.executor)
            kept = make_trajectory()
            assert await durable.put(kept) is False
            assert await durable.spooled(kept.id) == kept
            invalid = make_trajectory(status=TrajectoryStatus.TRAJECTORY_STATUS_UNSPECIFIED)
        async with channel(store_only.settings.store_addr, store_only.settings) as ch:
            durable = DurableStore(store_pb2_grpc.TrajectoryStoreStub(ch), Spool(tmp_path / "other"), settings.executor)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await durable.put(invalid)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and await durable.spooled(invalid.id) is None
