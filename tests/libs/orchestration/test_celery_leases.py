"""The journal's lease is owned, through real Celery workers (subprocesses) on the real Redis and
Postgres: a worker that stalls past its lease while it evaluates is taken over by another, and
when it wakes it stops before promoting (LeaseLost), so one copy alone promotes; a task whose
work kills its worker process is run three times (orchestration.max_attempts), then parked as
failed, and Celery delivers it no more. The tasks are the stand-in worker's (standin_worker.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest
from celery.states import FAILURE, SUCCESS

from tests.libs.orchestration.celery_processes import cluster, owner_pid, until

pytestmark = pytest.mark.slow

EVALUATE_THEN_PROMOTE = "tests.standin.evaluate_then_promote"
KILL_MY_WORKER = "tests.standin.kill_my_worker"


def broker_empty(running) -> bool:
    """No copy of any task left on the broker, neither queued nor held by a worker."""
    return running.redis.llen("default") == 0 and running.redis.hlen("unacked") == 0


async def test_two_workers_on_one_stale_lease_one_promotes_and_the_stalled_one_stops_with_lease_lost(tmp_path, orchestration_db):
    async with cluster(tmp_path, orchestration_db, visibility_timeout_seconds=2, lease_seconds=1) as running:
        running.worker("a"), running.worker("b")
        await running.ready("a", "b")
        sent = running.app.send_task(EVALUATE_THEN_PROMOTE, kwargs={"key": "promote:raced", "seconds": 4})
        first = await until(lambda: running.journal.get("promote:raced"), 30, "the first claim")
        stalled, stalled_pid = running.holder(first), owner_pid(first)
        # Its pool process stalls (a long pause, swapped out): no heartbeat, while its worker
        # lives. Redis hands the task to the other worker after the visibility timeout; that one
        # finds the lease stale and takes the run over.
        os.kill(stalled_pid, signal.SIGSTOP)
        try:
            taken = await until(lambda: (row := running.journal.get("promote:raced")).attempts == 2 and row, 30, "a take-over")
        finally:
            os.kill(stalled_pid, signal.SIGCONT)
        holder_pid = owner_pid(taken)
        assert running.holder(taken) != stalled

        meta = await until(lambda: (meta := running.meta(sent.id))["status"] == SUCCESS and meta, 40, "the promotion")
        await until(lambda: broker_empty(running), 30, "every copy of the task to end")
        # Both evaluated; the stalled one, awake again, found the lease lost and stopped there.
        assert sorted(running.notes()) == sorted([f"evaluating {stalled_pid}", f"evaluating {holder_pid}", f"promoted {holder_pid}"])
        assert meta["result"]["promoted_by"] == holder_pid
        assert f"lease on promote:raced lost: {first.owner} no longer holds it; now {taken.owner}" in running.log(stalled)
        done = running.journal.get("promote:raced")
        assert done.status == "succeeded" and done.owner == taken.owner and done.attempts == 2


async def test_a_task_that_kills_its_worker_three_times_is_parked_as_failed_and_not_run_a_fourth_time(tmp_path, orchestration_db):
    async with cluster(tmp_path, orchestration_db, visibility_timeout_seconds=60, lease_seconds=1) as running:
        running.worker("a")
        await running.ready("a")
        sent = running.app.send_task(KILL_MY_WORKER, kwargs={"key": "train:poison"})
        # Each kill puts the task back at once (task_reject_on_worker_lost); the next delivery
        # finds the dead attempt's lease fresh, waits a busy check, then takes it over.
        meta = await until(lambda: (meta := running.meta(sent.id))["status"] == FAILURE and meta, 90, "the task to be parked")
        assert "parked after 3 attempts" in json.dumps(meta["result"])
        parked = running.journal.get("train:poison")
        assert parked.status == "failed" and parked.attempts == 3
        assert parked.error.startswith("parked after 3 attempts (orchestration.max_attempts 3); the last: its worker died")

        await asyncio.sleep(3)  # three busy checks' worth: a copy left anywhere would have run by now
        assert broker_empty(running)
        started = running.notes()
        assert len(started) == 3 and len(set(started)) == 3, started  # three pool processes, each killed
        assert running.journal.get("train:poison").attempts == 3
        assert running.processes["a"].poll() is None  # the worker itself lives on
