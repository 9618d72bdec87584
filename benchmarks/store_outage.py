"""Store outage benchmark (issue 60): the store's Postgres cut for a while under a steady load of
Solve streams, and what the executor's spool does about it (not a test).

The stack runs in this process (one event loop), the ScriptedPolicy stand-in in a process of its
own (agentic episodes: one web_search call, an answer), the store on a scratch Postgres database
reached through a TCP proxy (tests/tcp_proxy.py) whose cut drops every connection and refuses new
ones. For each outage length: load for a few seconds, cut, keep the load on for the outage,
restore, keep it on until the spool is empty, stop. It reports per outage: the episodes that
ended during it and their p50 and worst latency (the first ones wait out
executor.store_retry_seconds, the rest go to the spool), the spool depth at the restore, the
seconds from the restore to an empty spool (the load going on; the replay's backoff, at most
executor.spool_replay_max_backoff_seconds, included), how many went through the spool, and the
checks afterwards: every acknowledged trajectory in the store exactly once, each counted once in
gearshift_executor_episodes_total, no failed Solve.

    .venv/bin/python benchmarks/store_outage.py                          # outages 5, 15, 30, 60 s
    .venv/bin/python benchmarks/store_outage.py --outages 5 15 --streams 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.tcp_proxy

import grpc  # noqa: E402
from gearshift.api.common.v1.common_pb2 import Mode  # noqa: E402
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc  # noqa: E402
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc  # noqa: E402
from gearshift.clients import channel  # noqa: E402
from gearshift.embedded import embedded  # noqa: E402
from gearshift.settings import Settings  # noqa: E402
from gearshift.testing.postgres import scratch_database  # noqa: E402
from gearshift.testing.scripted_policy import instant_policy_process  # noqa: E402
from prometheus_client import REGISTRY  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from tests.tcp_proxy import tcp_proxy  # noqa: E402

WARMUP_SECONDS = 3.0
DRAIN_LIMIT_SECONDS = 600.0


def spool_depth() -> float:
    return REGISTRY.get_sample_value("gearshift_executor_spool_depth") or 0.0


def spooled() -> float:
    return REGISTRY.get_sample_value("gearshift_executor_spool_trajectories_total", {"event": "spooled"}) or 0.0


def episodes_counted() -> float:
    """gearshift_executor_episodes_total over every label: episodes the store has."""
    return sum(sample.value for family in REGISTRY.collect() if family.name == "gearshift_executor_episodes"
               for sample in family.samples if sample.name == "gearshift_executor_episodes_total")


class Load:
    """Streams Solve calls back to back until stopped; keeps each acknowledged trajectory id with
    when its episode ended and how long its Solve took."""

    def __init__(self, stub: executor_pb2_grpc.ExecutorStub, task_source: str, streams: int):
        self.stub, self.task_source = stub, task_source
        self.acknowledged: list[tuple[float, float, str]] = []  # (started at, ended at, trajectory id)
        self.errors: list[str] = []
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._stream()) for _ in range(streams)]

    async def _stream(self) -> None:
        request = executor_pb2.SolveRequest(query="What is the capital of France?", mode=Mode.MODE_AGENTIC, task_source=self.task_source)
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                events = [event async for event in self.stub.Solve(request)]
            except grpc.aio.AioRpcError as exc:
                self.errors.append(exc.code().name)
                continue
            self.acknowledged.append((started, time.monotonic(), events[-1].final.trajectory.id))

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


async def until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def one_outage(settings: Settings, proxy, outage: float, streams: int) -> dict:
    task_source = f"outage-{outage:g}s-{uuid.uuid4().hex[:6]}"
    async with channel(settings.executor_addr, settings) as executor_channel, channel(settings.store_addr, settings) as store_channel:
        counted, spooled_before = episodes_counted(), spooled()
        load = Load(executor_pb2_grpc.ExecutorStub(executor_channel), task_source, streams)
        await asyncio.sleep(WARMUP_SECONDS)
        proxy.cut()
        cut_at = time.monotonic()
        await asyncio.sleep(outage)
        depth_at_restore = spool_depth()
        proxy.restore()
        restored_at = time.monotonic()
        drained = await until(lambda: spool_depth() == 0, DRAIN_LIMIT_SECONDS)
        replay_seconds = time.monotonic() - restored_at
        await load.stop()
        await until(lambda: spool_depth() == 0, DRAIN_LIMIT_SECONDS)
        export = store_pb2.ExportRequest(filter=store_pb2.TrajectoryFilter(task_source=task_source))
        stored = [t.id async for t in store_pb2_grpc.TrajectoryStoreStub(store_channel).Export(export)]
    overlapping = [ended - started for started, ended, _ in load.acknowledged if started < restored_at and ended >= cut_at]
    acknowledged = [trajectory_id for _, _, trajectory_id in load.acknowledged]
    return {
        "outage_s": outage,
        "episodes_ending_in_outage": len(overlapping),
        "their_latency_p50_s": round(statistics.median(overlapping), 2) if overlapping else None,
        "their_latency_max_s": round(max(overlapping), 2) if overlapping else None,
        "spool_depth_at_restore": int(depth_at_restore),
        "replay_s": round(replay_seconds, 2) if drained else None,
        "spooled": int(spooled() - spooled_before),
        "acknowledged": len(acknowledged),
        "stored": len(stored),
        "stored_once_each": sorted(stored) == sorted(acknowledged),
        "counted": int(episodes_counted() - counted),
        "failed_solves": len(load.errors),
    }


async def main(outages: list[float], streams: int, retry_seconds: float | None) -> None:
    with scratch_database("gearshift_outage") as postgres_url, instant_policy_process() as policy_url:
        url = make_url(postgres_url)
        async with tcp_proxy(url.host, url.port) as proxy:
            proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
            settings = Settings(data_dir=tempfile.mkdtemp(prefix="gearshift-outage-"), metrics_port=0, database_url=proxied)
            if retry_seconds is not None:
                settings = settings.model_copy(update={"executor": settings.executor.model_copy(update={"store_retry_seconds": retry_seconds})})
            settings = settings.with_policy(policy_url, "smollm2")
            print(f"# {streams} agentic Solve streams, store_retry_seconds {settings.executor.store_retry_seconds:g}, "
                  f"replay backoff cap {settings.executor.spool_replay_max_backoff_seconds:g} s; stack in one process", flush=True)
            async with embedded(settings) as platform:
                for outage in outages:
                    print(json.dumps(await one_outage(platform.settings, proxy, outage, streams)), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outages", type=float, nargs="+", default=[5, 15, 30, 60], help="Outage lengths in seconds")
    parser.add_argument("--streams", type=int, default=16, help="Concurrent Solve streams")
    parser.add_argument("--retry-seconds", type=float, default=None, help="executor.store_retry_seconds (default: the setting's)")
    args = parser.parse_args()
    asyncio.run(main(args.outages, args.streams, args.retry_seconds))
