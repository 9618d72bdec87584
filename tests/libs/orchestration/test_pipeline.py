"""The closed loop through Celery with a real worker (a subprocess) on the real Redis and the
real Postgres: score -> snapshot -> train (the SFT job on a tiny model) -> evaluate (the
evaluation harness) -> publish (the built-in policy server switches). Then every task delivered
a second time does nothing again."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid

import pytest
from gearshift.api.common.v1.common_pb2 import Checkpoint, CheckpointStatus, Mode, Trajectory, TrajectoryStatus, Turn
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.orchestration.app import create_app
from gearshift.services.policy_server.server import running
from gearshift.settings import PolicyServerSettings, Settings
from gearshift.storage.models import job_runs
from sqlalchemy import select

from tests import workers

pytestmark = pytest.mark.slow("a Celery worker process trains and evaluates a tiny model, then every task is delivered again")

REDIS_URL = workers.redis_url()
SFT = {"optim": {"max_steps": 2, "threads": 1}, "batch_size": 2, "max_length": 1024, "balance_difficulty": False,
       "output": {"progress": False}}


def seeded(n: int) -> list[Trajectory]:
    """Unscored, completed instant-mode trajectories with references (as served traffic is stored)."""
    found = []
    for i in range(n):
        a, b = i + 2, i + 3
        found.append(Trajectory(
            id=str(uuid.uuid4()), query=f"What is {a}+{b}?", mode=Mode.MODE_INSTANT, answer=str(a + b),
            reference_answer=str(a + b), status=TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED,
            turns=[Turn(index=0, output=f"{a + b}</answer>")], task_source="user",
        ))
    return found


def worker_env(settings: Settings, policy_url: str) -> dict[str, str]:
    return os.environ | {
        "GEARSHIFT_DATA_DIR": str(settings.data_dir / "worker"),
        "GEARSHIFT_DATABASE_URL": settings.database_url,
        "GEARSHIFT_REDIS_URL": REDIS_URL,
        "GEARSHIFT_STORE_ADDR": settings.store_addr,
        "GEARSHIFT_REWARD_ADDR": settings.reward_addr,
        "GEARSHIFT_POLICY_CLIENT__URL": policy_url,
        "GEARSHIFT_METRICS_PORT": "0",
        "GEARSHIFT_LOG_LEVEL": "WARNING",
        "GEARSHIFT_POLICY_SERVER__THREADS": "1",
        "GEARSHIFT_ORCHESTRATION__EVAL_ITEMS": "2",
        "GEARSHIFT_ORCHESTRATION__GATE_MODES": '["instant"]',
        "GEARSHIFT_EXECUTOR__MAX_TOKENS_PER_TURN": "16",
    }


async def result_of(app, task_id: str, timeout: float = 240):
    """Waits for a task without blocking the event loop that serves the store and reward."""
    result = app.AsyncResult(task_id)
    deadline = time.monotonic() + timeout
    while not result.ready():
        assert time.monotonic() < deadline, f"task {task_id} still {result.state}"
        await asyncio.sleep(0.2)
    return result.get(propagate=True)


async def test_one_round_end_to_end_then_redelivery_does_nothing_twice(tmp_path, orchestration_db, tiny_models):
    base, _ = tiny_models
    url = orchestration_db.url.render_as_string(hide_password=False)
    settings = Settings(data_dir=tmp_path, metrics_port=0, database_url=url, log_level="WARNING")
    policy = settings.model_copy(update={"policy_server": PolicyServerSettings(model=str(base), port=0, threads=1)})
    async with running(policy) as server, embedded(settings, ("store", "reward")) as platform:
        stack = platform.settings
        async with channel(stack.store_addr, stack) as ch:
            store = store_pb2_grpc.TrajectoryStoreStub(ch)
            trajectories = seeded(4)
            await store.Put(store_pb2.PutRequest(trajectories=trajectories))
            await store.RegisterCheckpoint(store_pb2.RegisterCheckpointRequest(
                checkpoint=Checkpoint(id="base-tiny", kind="policy", uri=str(base), job="base")))
            await store.UpdateCheckpoint(store_pb2.UpdateCheckpointRequest(id="base-tiny", status=CheckpointStatus.CHECKPOINT_STATUS_PUBLISHED))

            worker = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "gearshift.orchestration.app", "worker", "-Q", "default,training",
                 "--concurrency", "1", "--loglevel", "WARNING", "--hostname", f"test-{uuid.uuid4().hex[:6]}@%h"],
                env=worker_env(stack, server.base_url), stdout=subprocess.DEVNULL, stderr=open(tmp_path / "worker.log", "wb"),
            )
            app = create_app(REDIS_URL)
            try:
                # Served traffic has no split: training on it is said explicitly (the default is the train split).
                served = {"correctness": "correct", "split": "", "purposes": ["serving"]}
                started = app.send_task("gearshift.orchestration.tasks.start_round", kwargs={"job": "sft", "config": SFT, "data": served})
                chain_id = (await result_of(app, started.id, 60))["chain"]
                gated = await result_of(app, chain_id)

                # A random tiny model answers nothing correctly, before or after SFT: the gate
                # refuses it (two infinite costs of pass are no tie) and serving stays as it was.
                assert not gated["promoted"] and gated["baseline_id"] == "base-tiny"
                assert "instant: the candidate answers nothing correctly (nor does the published checkpoint)" in gated["reasons"]
                checkpoint = await store.GetCheckpoint(store_pb2.GetCheckpointRequest(id=gated["checkpoint_id"], include_lineage=True))
                assert checkpoint.status == CheckpointStatus.CHECKPOINT_STATUS_REJECTED and checkpoint.parent_id == "base-tiny"
                assert sorted(checkpoint.trajectory_ids) == sorted(t.id for t in trajectories)
                assert checkpoint.eval_metrics["basic_arithmetic/test/instant/accuracy"] == 0.0
                for trajectory in trajectories:
                    stored = (await store.Get(store_pb2.GetRequest(id=trajectory.id))).trajectory
                    assert stored.reward.correct and stored.reward.kind == "apo" and stored.reward.format_valid  # scored with its turns
                assert server.engine.tally.switches == 0

                # An operator publishes it anyway: serving switches once.
                published = await result_of(app, app.send_task("gearshift.orchestration.tasks.publish", args=[checkpoint.id]).id, 120)
                assert published["target"] == "builtin" and published["switch_seconds"] > 0
                checkpoint = await store.GetCheckpoint(store_pb2.GetCheckpointRequest(id=checkpoint.id))
                assert checkpoint.status == CheckpointStatus.CHECKPOINT_STATUS_PUBLISHED
                assert str(server.engine.current.path) == checkpoint.uri and server.engine.tally.switches == 1

                with orchestration_db.connect() as connection:
                    runs = {row.kind: row for row in connection.execute(select(job_runs)).all()}
                assert {kind: runs[kind].status for kind in ("score", "snapshot", "train", "promote", "publish")} == dict.fromkeys(
                    ("score", "snapshot", "train", "promote", "publish"), "succeeded")
                assert runs["train"].external_id and "step" in runs["train"].log.lower()

                # Deliver the work again: everything is found done, nothing runs twice.
                again = [
                    app.send_task("gearshift.orchestration.tasks.train", args=[runs["snapshot"].result], kwargs={"job": "sft", "config": SFT, "parent_id": "base-tiny"}),
                    app.send_task("gearshift.orchestration.tasks.promote", kwargs={"checkpoint_id": checkpoint.id}),
                    app.send_task("gearshift.orchestration.tasks.publish", args=[checkpoint.id]),
                ]
                for sent in again:
                    assert (await result_of(app, sent.id, 60))["deduplicated"] is True
                assert server.engine.tally.switches == 1
                with orchestration_db.connect() as connection:
                    attempts = {row.kind: row.attempts for row in connection.execute(select(job_runs)).all()}
                assert attempts["train"] == attempts["publish"] == 1
                assert len(list((tmp_path / "worker" / "runs").iterdir())) == 1  # one training process ever
            finally:
                worker.terminate()
                worker.wait(timeout=30)
