"""Load test of the whole stack: many concurrent Solve streams for a fixed time against the
services running one process each (as `gearshift up` runs them), the store on Postgres (a
scratch database, dropped afterwards), everything on loopback. Prints JSON: completed
episodes/s, latency p50/p99, errors by kind, and each service's resident memory (its process
tree) after a warm-up at full load, every few seconds, and at the end.

Two policies:

- default: the ScriptedPolicy stand-in (instant answers, its own process), so that the services
  themselves are what is loaded; episodes rotate instant, reasoning and agentic (a web_search
  call and an answer), each scored against a reference;
- --model: the real SmolLM2-135M on the built-in policy server (a process of the stack),
  episodes rotating instant, reasoning, agentic and routed by the model.

    .venv/bin/python benchmarks/solve_load.py                                  # 200 streams, 60 s
    .venv/bin/python benchmarks/solve_load.py --model --streams 8 --seconds 300

Bounded: no new episode starts after --warmup-seconds + --seconds, and those still running get
--drain-seconds.
Goals (issue 13): no errors; each service's memory flat from start to end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import tempfile
import time
from collections import Counter

import grpc
import psutil
from gearshift import weights
from gearshift.api.common.v1.common_pb2 import Mode, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.clients import channel
from gearshift.settings import Settings
from gearshift.stack import Stack
from gearshift.testing.postgres import scratch_database
from gearshift.testing.scripted_policy import instant_policy_process

BASE_PORT = 23500  # below the ephemeral range (32768-60999): no client socket can hold it
STREAMS_PER_CHANNEL = 50
RSS_SAMPLE_SECONDS = 5.0
SCRIPTED_MODES = [Mode.MODE_INSTANT, Mode.MODE_REASONING, Mode.MODE_AGENTIC]
MODEL_MODES = [Mode.MODE_INSTANT, Mode.MODE_REASONING, Mode.MODE_AGENTIC, Mode.MODE_UNSPECIFIED]


# Postgres and the stack


def rss_mib(stack: Stack) -> dict[str, float]:
    """Resident memory of each service's process tree (the sandbox's zygote and workers included)."""
    sizes = {}
    for name, process in stack.processes.items():
        total = 0
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(process.pid)
            for member in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    total += member.memory_info().rss
        sizes[name] = round(total / 2**20, 1)
    return sizes


# The load


class Tally:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()


async def one_episode(stub, mode: int, tally: Tally | None) -> None:
    """One Solve stream to its end; counted in tally (None: a warm-up episode, not counted)."""
    request = executor_pb2.SolveRequest(query="What is the capital of France?", mode=mode, reference_answer="Paris", run_id="load")
    tally = tally or Tally()
    started = time.perf_counter()
    final = None
    try:
        async for event in stub.Solve(request):
            final = event if event.HasField("final") else final
    except grpc.aio.AioRpcError as exc:
        tally.errors[f"grpc {exc.code().name}: {(exc.details() or '')[:120]}"] += 1
        return
    if final is None:
        tally.errors["stream ended without a final event"] += 1
        return
    status = TrajectoryStatus.Name(final.final.trajectory.status)
    tally.statuses[status] += 1
    if final.final.trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_FAILED:
        tally.errors[f"trajectory failed: {final.final.trajectory.error[:120]}"] += 1
        return
    tally.latencies.append(time.perf_counter() - started)


async def run_load(settings: Settings, stack: Stack, args: argparse.Namespace, modes: list[int]) -> dict:
    """Full load from the start; the first --warmup-seconds fill every buffer and pool and are
    not counted, so that the memory taken after them is the working set at this load."""
    tally, series = Tally(), {}
    rotation = itertools.cycle(modes)
    async with contextlib.AsyncExitStack() as exits:
        channels = [await exits.enter_async_context(channel(settings.executor_addr, settings))
                    for _ in range(max(1, args.streams // STREAMS_PER_CHANNEL))]
        stubs = [executor_pb2_grpc.ExecutorStub(ch) for ch in channels]
        begun = time.perf_counter()
        measured_from = begun + args.warmup_seconds
        deadline = measured_from + args.seconds

        async def worker(index: int) -> None:
            while (now := time.perf_counter()) < deadline:
                await one_episode(stubs[index % len(stubs)], next(rotation), tally if now >= measured_from else None)

        async def sample_memory() -> None:
            while True:
                for name, size in rss_mib(stack).items():
                    series.setdefault(name, []).append(size)
                await asyncio.sleep(RSS_SAMPLE_SECONDS)

        workers = [asyncio.create_task(worker(i)) for i in range(args.streams)]
        await asyncio.sleep(args.warmup_seconds)
        rss_start = rss_mib(stack)
        sampler = asyncio.create_task(sample_memory())
        _, late = await asyncio.wait(workers, timeout=args.seconds + args.drain_seconds)
        for task in late:
            task.cancel()
        elapsed = time.perf_counter() - measured_from
        sampler.cancel()
        rss_end = rss_mib(stack)
    latencies = sorted(tally.latencies)
    return {
        "streams": args.streams,
        "warmup_seconds": args.warmup_seconds,
        "seconds": round(elapsed, 1),
        "completed_episodes": len(latencies),
        "episodes_per_second": round(len(latencies) / elapsed, 2),
        "latency_p50_seconds": round(statistics.median(latencies), 3) if latencies else None,
        "latency_p99_seconds": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 3) if latencies else None,
        "still_running_at_the_end": len(late),
        "errors": sum(tally.errors.values()),
        "error_kinds": dict(tally.errors),
        "statuses": dict(tally.statuses),
        "rss_mib": {
            name: {"start": rss_start[name], "end": rss_end[name], f"every_{RSS_SAMPLE_SECONDS:.0f}s": series.get(name, [])}
            for name in rss_start
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=200, help="concurrent Solve streams")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long new episodes are started")
    parser.add_argument("--drain-seconds", type=float, default=120.0, help="then how long running ones may finish")
    parser.add_argument("--warmup-seconds", type=float, default=10.0, help="full load before the measured time (not counted)")
    parser.add_argument("--model", action="store_true", help="the real SmolLM2 on the built-in policy server")
    args = parser.parse_args()
    with scratch_database("gearshift_load") as database_url, contextlib.ExitStack() as exits:
        data_dir = tempfile.mkdtemp(prefix="gearshift-load-")
        # The service processes read their settings from the environment.
        os.environ["GEARSHIFT_DATABASE_URL"] = database_url
        os.environ["GEARSHIFT_LOG_LEVEL"] = "WARNING"
        if args.model:
            os.environ["GEARSHIFT_POLICY_SERVER__MODEL"] = str(weights.cache_smollm2(Settings().data_dir / "models"))
            settings, modes = Settings(data_dir=data_dir, database_url=database_url), MODEL_MODES
        else:
            url = exits.enter_context(instant_policy_process())
            settings, modes = Settings(data_dir=data_dir, database_url=database_url).with_policy(url, "smollm2"), SCRIPTED_MODES
        stack = Stack(settings, base_port=BASE_PORT, with_policy=args.model)
        stack.start()
        exits.callback(stack.stop)
        health = stack.wait_ready()
        if any(state != "SERVING" for _, state in health.values()):
            raise RuntimeError(f"the stack did not come up: {health}")
        figures = asyncio.run(run_load(stack.client_settings(), stack, args, modes))
    figures["policy"] = "SmolLM2-135M on the built-in server" if args.model else "ScriptedPolicy stand-in"
    figures["load_average_1min"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
