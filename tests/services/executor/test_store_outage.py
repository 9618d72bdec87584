"""Finished episodes survive a database outage (issue 60): the store's Postgres is reached
through a TCP proxy that cuts every connection and refuses new ones; 16 agentic episodes end
while it is cut. Each is acknowledged to its client with its trajectory, waits in the executor's
spool, and is in the store exactly once after the proxy is restored; an episode started during
the outage under a trajectory id of the client's runs and is stored too.

The outage is OUTAGE_SECONDS, a multiple of the executor's store retry budget (set to
RETRY_SECONDS here, 30 s by default) rather than the issue's 60 s, so the test stays short; it
is 34 times the store client's own retries (4 attempts, about 0.35 s), which were all that stood
between an outage and a failed Solve before. benchmarks/store_outage.py runs outages of 5 to
60 s."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from gearshift.api.common.v1.common_pb2 import Mode, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.testing.scripted_policy import serve_scripted
from prometheus_client import REGISTRY
from sqlalchemy.engine import make_url

from tests.services.executor.test_episode import scripted_model
from tests.tcp_proxy import tcp_proxy

STREAMS = 16
RETRY_SECONDS = 2.0
OUTAGE_SECONDS = 6 * RETRY_SECONDS
REPLAY_BACKOFF_SECONDS = 0.5


def sample(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class GatedFinalTurn:
    """scripted_model, whose last turn (the answer after the tool's result) waits for `opened`:
    every episode is held just before its end until the test has cut the database."""

    def __init__(self):
        self.opened = asyncio.Event()
        self.waiting = 0
        self.all_waiting = asyncio.Event()

    async def __call__(self, body: dict) -> str:
        messages = body.get("messages") or []
        if messages and "<tool_response>" in messages[-1]["content"]:
            self.waiting += 1
            if self.waiting == STREAMS:
                self.all_waiting.set()
            await self.opened.wait()
        return scripted_model(body)


async def solve(settings, request: executor_pb2.SolveRequest) -> list[executor_pb2.SolveEvent]:
    async with channel(settings.executor_addr, settings) as ch:
        return [item async for item in executor_pb2_grpc.ExecutorStub(ch).Solve(request)]


async def stored_ids(settings, task_source: str) -> list[str]:
    async with channel(settings.store_addr, settings) as ch:
        stub = store_pb2_grpc.TrajectoryStoreStub(ch)
        request = store_pb2.ExportRequest(filter=store_pb2.TrajectoryFilter(task_source=task_source))
        return [trajectory.id async for trajectory in stub.Export(request)]


async def get(settings, trajectory_id: str):
    async with channel(settings.store_addr, settings) as ch:
        return (await store_pb2_grpc.TrajectoryStoreStub(ch).Get(store_pb2.GetRequest(id=trajectory_id))).trajectory


async def until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


@pytest.mark.slow("a 12 s database outage and the replay after it")
async def test_episodes_that_end_while_the_database_is_down_are_acknowledged_and_stored_once(settings, postgres_url):
    url = make_url(postgres_url)
    policy = GatedFinalTurn()
    executor = settings.executor.model_copy(update={"store_retry_seconds": RETRY_SECONDS, "spool_replay_max_backoff_seconds": REPLAY_BACKOFF_SECONDS})
    async with tcp_proxy(url.host, url.port) as proxy, serve_scripted(policy) as policy_url:
        proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        base = settings.with_policy(policy_url).model_copy(update={"database_url": proxied, "executor": executor})
        async with embedded(base) as platform:
            running = platform.settings
            task_source = f"outage-{uuid.uuid4().hex[:8]}"
            completed = sample("gearshift_executor_episodes_total", mode="agentic", strategy="forced", status="completed")
            request = executor_pb2.SolveRequest(query="What is 17*23?", mode=Mode.MODE_AGENTIC, reference_answer="391", task_source=task_source)
            streams = [asyncio.create_task(solve(running, request)) for _ in range(STREAMS)]
            await asyncio.wait_for(policy.all_waiting.wait(), 60)

            proxy.cut()
            cut_at = time.monotonic()
            policy.opened.set()
            results = await asyncio.wait_for(asyncio.gather(*streams, return_exceptions=True), OUTAGE_SECONDS - 1)
            acknowledged_after = time.monotonic() - cut_at
            assert [r for r in results if isinstance(r, BaseException)] == []  # today: 16 UNAVAILABLE
            finals = [events[-1].final.trajectory for events in results]
            assert all(t.status == TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED and t.answer == "391" for t in finals)
            assert len({t.id for t in finals}) == STREAMS
            assert proxy.is_cut and acknowledged_after < OUTAGE_SECONDS
            assert sample("gearshift_executor_spool_depth") == STREAMS
            # Counted when stored, not before: none is in the store yet.
            assert sample("gearshift_executor_episodes_total", mode="agentic", strategy="forced", status="completed") == completed
            # A client's retry of an acknowledged episode is answered from the spool, not run again.
            retried = executor_pb2.SolveRequest(query="What is 17*23?", trajectory_id=finals[0].id)
            assert [e.final.trajectory for e in await solve(running, retried)] == [finals[0]]
            # A stream the gateway starts now names its own trajectory id: the look-up for an earlier
            # run of that id cannot reach the store, and the episode runs rather than fail at its start.
            fresh = executor_pb2.SolveRequest(query="What is 17*23?", mode=Mode.MODE_AGENTIC, reference_answer="391",
                                              task_source=task_source, trajectory_id=str(uuid.uuid4()))
            started_in_outage = (await solve(running, fresh))[-1].final.trajectory
            assert started_in_outage.id == fresh.trajectory_id and started_in_outage.status == TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED
            finals.append(started_in_outage)

            await asyncio.sleep(OUTAGE_SECONDS - (time.monotonic() - cut_at))
            proxy.restore()
            assert await until(lambda: sample("gearshift_executor_spool_depth") == 0, 30)

            assert sorted(await stored_ids(running, task_source)) == sorted(t.id for t in finals)  # each once
            for trajectory in finals:
                assert await get(running, trajectory.id) == trajectory
            assert sample("gearshift_executor_episodes_total", mode="agentic", strategy="forced", status="completed") == completed + len(finals)
