"""Celery workers as subprocesses on the real Redis and Postgres, watching a stand-in training
run (standin_run.py, started and re-attached to by the LocalRunner): a worker killed mid-run
gives its task back within the visibility timeout and the next worker re-attaches to the same
run; a copy handed out while its worker lives starts nothing; SIGTERM stops a worker within its
soft shutdown and puts its task back at once; the queue-length gauge reads Redis' LLEN."""

from __future__ import annotations

import signal
import time

import httpx
import pytest
from celery.states import RETRY, SUCCESS

from tests.libs.orchestration.celery_processes import cluster, until
from gearshift.testing.ports import free_port

pytestmark = pytest.mark.slow

TRAIN = "gearshift.orchestration.tasks.train"



async def result_of(running, task_id: str, timeout: float, seen: set[str] | None = None) -> dict:
    """The task's result once it succeeded, noting every state it was seen in."""

    def done():
        meta = running.meta(task_id)
        if seen is not None:
            seen.add(meta["status"])
        return meta["status"] == SUCCESS and meta["result"]

    return await until(done, timeout, f"task {task_id}")


async def test_a_worker_killed_mid_run_gives_its_task_back_after_the_visibility_timeout_and_the_next_re_attaches(tmp_path, orchestration_db):
    async with cluster(tmp_path, orchestration_db, run_seconds=12, visibility_timeout_seconds=3, lease_seconds=2) as running:
        running.worker("a"), running.worker("b")
        await running.ready("a", "b")
        sent = running.app.send_task(TRAIN, kwargs={"job": "sft", "config": {}, "key": "train:killed"})
        run = await until(lambda: (row := running.journal.get("train:killed")) and row.external_id and running.starts() and row, 30, "the run")
        holder = running.holder(run)
        running.processes[holder].send_signal(signal.SIGKILL)  # its pool process dies with it; the run does not
        killed = time.monotonic()

        taken = await until(lambda: (row := running.journal.get("train:killed")).attempts == 2 and row, 20, "a take-over")
        # Back after the visibility timeout (3 s), a sweep (1 s) and at most a busy check (1.5 s):
        # 3-4 s on an idle machine; the bound leaves room for a loaded one.
        assert time.monotonic() - killed < 3 + 1 + 1.5 + 10
        survivor = "b" if holder == "a" else "a"
        assert running.holder(taken) == survivor and taken.external_id == run.external_id

        result = await result_of(running, sent.id, 30)
        assert result["run"] == run.external_id.rsplit("/", 1)[1] and result["metrics"]["steps"] > 0
        assert len(running.starts()) == 1  # re-attached: one training process ever
        done = running.journal.get("train:killed")
        assert done.status == "succeeded" and done.attempts == 2 and "step" in done.log


async def test_a_copy_handed_out_while_its_worker_lives_starts_nothing_and_ends_when_the_run_does(tmp_path, orchestration_db):
    async with cluster(tmp_path, orchestration_db, run_seconds=6, visibility_timeout_seconds=2, lease_seconds=2) as running:
        running.worker("a"), running.worker("b")
        await running.ready("a", "b")
        sent = running.app.send_task(TRAIN, kwargs={"job": "sft", "config": {}, "key": "train:watched"})
        seen: set[str] = set()
        result = await result_of(running, sent.id, 40, seen)
        # Redis handed the running task to the idle worker (every 2 s): it found the lease fresh and
        # waited (RETRY), then found the run done and ended on its stored result.
        assert RETRY in seen
        assert result["metrics"]["steps"] > 0
        # The copy ends too (the backend keeps the first success): nothing of the task is left
        # on the broker, neither queued nor held.
        await until(lambda: running.redis.llen("training") == 0 and running.redis.hlen("unacked") == 0, 10, "the copy's end")
        run = running.journal.get("train:watched")
        assert len(running.starts()) == 1 and run.attempts == 1 and run.status == "succeeded"


async def test_sigterm_stops_a_worker_within_its_soft_shutdown_and_puts_the_task_back_at_once(tmp_path, orchestration_db):
    async with cluster(tmp_path, orchestration_db, run_seconds=12, visibility_timeout_seconds=120, lease_seconds=2,
                       soft_shutdown_seconds=2) as running:
        running.worker("a"), running.worker("b")
        await running.ready("a", "b")
        sent = running.app.send_task(TRAIN, kwargs={"job": "sft", "config": {}, "key": "train:stopped"})
        run = await until(lambda: (row := running.journal.get("train:stopped")) and row.external_id and running.starts() and row, 30, "the run")
        holder = running.processes[running.holder(run)]
        holder.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        await until(lambda: holder.poll() is not None, 15, "the worker to stop")
        assert time.monotonic() - stopped < 2 + 20  # the soft shutdown, then the cold one (5 s on an idle 2-core machine)

        # Requeued when it stopped, not after the visibility timeout (120 s): the next worker finds
        # the lease fresh, checks again within a lease and re-attaches.
        taken = await until(lambda: (row := running.journal.get("train:stopped")).attempts == 2 and row, 30, "a take-over")
        assert time.monotonic() - stopped < 60 and taken.external_id == run.external_id
        result = await result_of(running, sent.id, 30)
        assert result["metrics"]["steps"] > 0 and len(running.starts()) == 1


async def test_the_worker_serves_the_queue_lengths_redis_holds(tmp_path):
    port = free_port()
    async with cluster(tmp_path, metrics_port=port) as running:
        running.worker("metrics", queues="default")  # leaves the training queue alone
        await running.ready("metrics")
        for i in range(3):
            running.app.send_task(TRAIN, kwargs={"key": f"train:queued-{i}"})
        running.app.send_task(TRAIN, kwargs={"key": "train:urgent"}, priority=9)  # kombu's list training\x06\x169

        async with httpx.AsyncClient() as client:
            text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
        lengths = {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("gearshift_celery_queue_length{")}
        assert running.redis.llen("training") == 3 and running.redis.llen("training\x06\x169") == 1
        assert lengths == {"default": 0.0, "training": 4.0}
