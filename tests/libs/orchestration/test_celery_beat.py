"""Celery beat and a worker as subprocesses on the real Redis and Postgres, the store embedded
here: the beat fires the training trigger on schedule and the round it queues runs (its
training run the stand-in); two beats at once check the trigger once per interval; `gearshift
up` starts a worker and one beat when Redis answers."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter

import pytest
import redis
from gearshift.api.common.v1.common_pb2 import Mode, Reward, Trajectory, TrajectoryStatus, Turn
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.settings import Settings
from gearshift.stack import Stack, redis_answers

from tests import workers
from tests.libs.orchestration.celery_processes import cluster, until

pytestmark = pytest.mark.slow

CHECK_TRIGGER = "gearshift.orchestration.tasks.check_trigger"


async def seed_scored(store_addr: str, settings, n: int) -> None:
    """Completed, correct, scored train-split trajectories: what a round trains on."""
    async with channel(store_addr, settings) as ch:
        store = store_pb2_grpc.TrajectoryStoreStub(ch)
        trajectories = [Trajectory(
            id=str(uuid.uuid4()), query=f"What is {i}+1?", mode=Mode.MODE_INSTANT, answer=str(i + 1), reference_answer=str(i + 1),
            status=TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, turns=[Turn(index=0, output=f"{i + 1}</answer>")], split="train",
        ) for i in range(n)]
        await store.Put(store_pb2.PutRequest(trajectories=trajectories))
        for trajectory in trajectories:
            await store.SetReward(store_pb2.SetRewardRequest(id=trajectory.id, reward=Reward(value=1.0, correct=True, format_valid=True, kind="apo")))


async def test_the_beat_fires_the_trigger_on_schedule_and_the_round_it_queues_runs(tmp_path, orchestration_db):
    async with cluster(tmp_path, orchestration_db, trigger_interval_seconds=1, trigger_new_scored=2) as running:
        await seed_scored(running.settings.store_addr, running.settings, 2)
        running.worker("worker")
        running.beat("beat")
        await running.ready("worker")

        # A round's row appears when it starts and succeeds once it has queued its chain.
        rounds = await until(lambda: (runs := running.journal.list("round")) and runs[0].status == "succeeded" and runs, 40, "a round")
        assert len(rounds) == 1
        snapshot = await until(lambda: (runs := running.journal.list("snapshot")) and runs[0].status == "succeeded" and runs[0], 30, "the snapshot")
        assert snapshot.result["count"] == 2
        trained = await until(lambda: (runs := running.journal.list("train")) and runs[0].status == "succeeded" and runs[0], 30, "the training run")
        assert trained.result["snapshot"] == snapshot.result["snapshot"] and len(running.starts()) == 1

        # The trigger keeps firing, once an interval, and starts no second round on the same data.
        checks = await until(lambda: len(found := running.task_results(CHECK_TRIGGER)) >= 4 and found, 20, "more trigger checks")
        fired = [check["window"] for check in checks if not check.get("skipped")]
        assert len(set(fired)) == len(fired) >= 3
        assert sum(check.get("started", False) for check in checks) == 1 and len(running.journal.list("round")) == 1


async def test_two_beats_check_the_trigger_once_per_interval(tmp_path, orchestration_db):
    async with cluster(tmp_path, orchestration_db, trigger_interval_seconds=1) as running:
        running.worker("worker")
        running.beat("beat-1"), running.beat("beat-2")
        await running.ready("worker")

        checks = await until(lambda: len(found := running.task_results(CHECK_TRIGGER)) >= 12 and found, 40, "trigger checks")
        fired = Counter(check["window"] for check in checks if not check.get("skipped"))
        skipped = [check for check in checks if check.get("skipped")]
        assert set(fired.values()) == {1}, fired  # one check per interval went on to count the new data
        assert len(skipped) >= 3 and {check["window"] for check in skipped} <= set(fired)  # the other beat's were dropped
        assert all(check["started"] is False for check in checks if not check.get("skipped"))  # no data: no round


@pytest.mark.xdist_group(workers.FIXED_PORTS)  # the stack's ports
async def test_gearshift_up_loop_starts_a_worker_and_one_beat(tmp_path, monkeypatch):
    url = workers.redis_url()
    client = redis.Redis.from_url(url)
    client.flushdb()
    monkeypatch.setenv("GEARSHIFT_ORCHESTRATION__TRIGGER_INTERVAL_SECONDS", "1")
    monkeypatch.setenv("GEARSHIFT_ORCHESTRATION__METRICS_PORT", "0")
    assert not redis_answers("redis://127.0.0.1:1/0")  # what makes `gearshift up --loop` start without the loop

    stack = Stack(Settings(redis_url=url, log_level="WARNING"), data_dir=str(tmp_path / "data"), base_port=27500, with_policy=False,
                  with_loop=True)
    stack.start()
    try:
        assert ["worker", "beat"] == list(stack.processes)[-2:] and stack.loop.startswith(f"worker + beat on {url}")
        states = await asyncio.to_thread(stack.wait_ready, 120)
        assert all(state == "SERVING" for _, state in states.values()), states

        def checked():
            metas = (json.loads(client.get(key)) for key in client.scan_iter("celery-task-meta-*"))
            return [meta["result"] for meta in metas if meta.get("name") == CHECK_TRIGGER and meta["status"] == "SUCCESS"]

        checks = await until(lambda: len(found := checked()) >= 2 and found, 60, "the trigger")
        assert not any(check.get("started") for check in checks)  # an empty store: no round
    finally:
        await asyncio.to_thread(stack.stop)
        client.flushdb()
    assert all(process.poll() is not None for process in stack.processes.values())
