"""Scale-out figures (issue 48), on loopback, the platform against its reference in one run.

Replicas of a service run as processes of their own on 127.0.0.2, .3, ... on one port, behind
one gRPC target naming every address (what a headless Service's DNS name resolves to:
gearshift.testing.replicas); the policy is the ScriptedPolicy stand-in answering at once (its
own process), so that what is measured is the platform's calls; the store is on Postgres (a
scratch database, dropped afterwards). Each figure is measured twice in the same run:

- balanced: this platform's channels (round_robin, health-checked, retries of idempotent calls,
  drains as long as the work in flight needs);
- reference: the channels and drain before issue 48 (pick_first, no retries, a 5 s drain),
  set through the same settings (GEARSHIFT_RPC__LOAD_BALANCING=pick_first,
  GEARSHIFT_RPC__RETRY_ATTEMPTS=1, GEARSHIFT_GRACE_SECONDS=5).

Figures:
1. calls per reward replica at 1, 2 and 3 replicas (90 episodes each; replicas started one by one);
2. seconds from a new replica serving to its first call, under load;
3. failed episodes when the busiest of 3 reward replicas is killed (SIGKILL) under --streams
   concurrent Solve streams (goal 0);
4. episodes failed or lost in a rolling restart of every gRPC service (2 replicas each plus a
   surge slot: start the new replica, then SIGTERM the old one, as maxUnavailable 0 rolls) under
   load (goal 0).

    .venv/bin/python benchmarks/scale_out.py                  # both configurations, about 6 min
    .venv/bin/python benchmarks/scale_out.py --only balanced --streams 50
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import tempfile
import time

import grpc
from gearshift.api.common.v1.common_pb2 import Mode, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.settings import Settings
from gearshift.stack import Stack
from gearshift.testing.postgres import scratch_database
from gearshift.testing.replicas import Replicas
from gearshift.topology import GRPC_SERVICE_NAMES

CONFIGS = {
    "balanced": {},
    "reference": {"GEARSHIFT_RPC__LOAD_BALANCING": "pick_first", "GEARSHIFT_RPC__RETRY_ATTEMPTS": "1", "GEARSHIFT_GRACE_SECONDS": "5"},
}
STACK_PORT = 23900  # the single-process services of figures 1-3; below the ephemeral range
REWARD_PORT = 23990
ROLLING_PORT = 24000  # one port per service of figure 4 (replicas share it over loopback addresses)
MODES = [Mode.MODE_INSTANT, Mode.MODE_REASONING, Mode.MODE_AGENTIC]
FIRST_CALL_TIMEOUT = 60.0


class Load:
    """Solve streams running until stopped: each episode's outcome (COMPLETED, the trajectory's
    status, or the RPC's error code) and the ids of the trajectories that came back."""

    def __init__(self, settings: Settings, streams: int):
        self.settings = settings
        self.streams = streams
        self.outcomes: list[str] = []
        self.ids: list[str] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._count = itertools.count()

    async def one(self, stub) -> None:
        n = next(self._count)
        request = executor_pb2.SolveRequest(query=f"What is the capital of France? ({n})", mode=MODES[n % 3], reference_answer="Paris")
        try:
            async for item in stub.Solve(request):
                if item.HasField("final"):
                    trajectory = item.final.trajectory
                    self.ids.append(trajectory.id)
                    self.outcomes.append(TrajectoryStatus.Name(trajectory.status).removeprefix("TRAJECTORY_STATUS_"))
                    return
            self.outcomes.append("NO_FINAL")
        except grpc.aio.AioRpcError as exc:
            self.outcomes.append(exc.code().name)

    async def __aenter__(self) -> Load:
        self._channel = channel(self.settings.executor_addr, self.settings)
        stub = executor_pb2_grpc.ExecutorStub(self._channel)

        async def stream() -> None:
            while not self._stop.is_set():
                await self.one(stub)

        self._tasks = [asyncio.ensure_future(stream()) for _ in range(self.streams)]
        return self

    async def episodes(self, count: int) -> None:
        """Waits until count more episodes ended."""
        target = len(self.outcomes) + count
        while len(self.outcomes) < target:
            await asyncio.sleep(0.05)

    async def __aexit__(self, *exc) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self._channel.close()

    def failed(self) -> int:
        return sum(outcome != "COMPLETED" for outcome in self.outcomes)


@contextlib.contextmanager
def configured(config: dict[str, str]):
    """The configuration in this process's environment, which every process it starts inherits."""
    saved = {key: os.environ.get(key) for key in config}
    os.environ.update(config)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key)
            else:
                os.environ[key] = value


async def first_call_seconds(replicas: Replicas, index: int, load: Load) -> float | None:
    """Seconds from replica index serving to its first Score call, under load (None: never, within the limit)."""
    replicas.start(index)
    served = time.monotonic()
    while time.monotonic() - served < FIRST_CALL_TIMEOUT:
        if replicas.calls_served(index, "Score") > 0:
            return round(time.monotonic() - served, 2)
        await load.episodes(3)
    return None


async def spread_and_kill(settings: Settings, data_dir: str, streams: int) -> dict:
    """Figures 1-3 on one stack whose reward service is up to three replicas."""
    replicas = Replicas("reward", REWARD_PORT, slots=3, env={}, log_dir=data_dir)
    stack = Stack(settings, data_dir=data_dir, base_port=STACK_PORT, with_policy=False, elsewhere={"reward": replicas.target})
    replicas.env = stack.environment()
    result: dict = {"calls_per_replica": {}, "first_call_seconds": []}
    with replicas:
        replicas.start(0)
        stack.start()
        try:
            states = await asyncio.to_thread(stack.wait_ready, 120)
            assert all(state == "SERVING" for _, state in states.values()), states
            client = stack.client_settings()
            async with Load(client, streams=10) as load:
                for count in (1, 2, 3):
                    if count > 1:
                        result["first_call_seconds"].append(await first_call_seconds(replicas, count - 1, load))
                    await load.episodes(10)  # every replica is connected by now, or never will be
                    before = [replicas.calls_served(i, "Score") for i in range(count)]
                    await load.episodes(90)
                    after = [replicas.calls_served(i, "Score") for i in range(count)]
                    result["calls_per_replica"][count] = [b - a for a, b in zip(before, after)]
                warm_failed = load.failed()
            async with Load(client, streams=streams) as load:
                await load.episodes(streams)
                busiest = max(range(3), key=lambda i: replicas.calls_served(i, "Score"))
                before = len(load.outcomes)
                replicas.kill(busiest)
                await load.episodes(2 * streams)
            result["kill"] = {"streams": streams, "episodes_after_kill": len(load.outcomes) - before,
                              "failed": load.failed(), "outcomes": _tally(load.outcomes)}
            result["failed_before_kill"] = warm_failed
        finally:
            stack.stop()
    return result


async def rolling_restart(settings: Settings, data_dir: str, streams: int) -> dict:
    """Figure 4: every gRPC service as 2 replicas (and a surge slot), replaced one by one under load."""
    fleets = {name: Replicas(name, ROLLING_PORT + i, slots=3, env={}, log_dir=data_dir) for i, name in enumerate(GRPC_SERVICE_NAMES)}
    elsewhere = {name: fleet.target for name, fleet in fleets.items()}
    env = Stack(settings, data_dir=data_dir, with_policy=False, elsewhere=elsewhere).environment() | {"GEARSHIFT_SANDBOX__WARM_WORKERS": "1"}
    client = settings.model_copy(update={f"{name}_addr": target for name, target in elsewhere.items()})
    with contextlib.ExitStack() as exits:
        for fleet in fleets.values():
            fleet.env = env
            exits.enter_context(fleet)
        for fleet in fleets.values():  # the store first: it migrates the scratch database
            await asyncio.to_thread(fleet.start_all, 2)
        drain_codes = []
        started = time.monotonic()
        async with Load(client, streams=streams) as load:
            await load.episodes(streams)
            for fleet in fleets.values():
                spare = 2
                for old in (0, 1):
                    await asyncio.to_thread(fleet.start, spare)
                    drain_codes.append(await asyncio.to_thread(fleet.terminate, old))
                    spare = old
            await load.episodes(streams)
        seconds = time.monotonic() - started
        missing = await _missing_from_store(client, load.ids)
    return {"streams": streams, "episodes": len(load.outcomes), "seconds": round(seconds, 1), "failed": load.failed(),
            "missing_from_store": missing, "outcomes": _tally(load.outcomes), "drain_exit_codes": sorted(set(drain_codes))}


async def _missing_from_store(settings: Settings, ids: list[str]) -> int:
    """Trajectories a client was told about that the store does not hold."""
    missing = 0
    async with channel(settings.store_addr, settings) as ch:
        store = store_pb2_grpc.TrajectoryStoreStub(ch)
        for trajectory_id in ids:
            try:
                await store.Get(store_pb2.GetRequest(id=trajectory_id))
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                missing += 1
    return missing


def _tally(outcomes: list[str]) -> dict[str, int]:
    return {outcome: outcomes.count(outcome) for outcome in sorted(set(outcomes))}


async def measure(policy_url: str, streams: int, rolling_streams: int) -> dict:
    """Every figure under the configuration in the environment."""
    with scratch_database("gearshift_scale") as database_url, tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(data_dir=data_dir, database_url=database_url).with_policy(policy_url, "smollm2")
        figures = await spread_and_kill(settings, data_dir, streams)
    with scratch_database("gearshift_roll") as database_url, tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(data_dir=data_dir, database_url=database_url).with_policy(policy_url, "smollm2")
        figures["rolling_restart"] = await rolling_restart(settings, data_dir, rolling_streams)
    return figures


def main() -> None:
    from gearshift.testing.scripted_policy import instant_policy_process

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=200, help="Solve streams when a replica is killed")
    parser.add_argument("--rolling-streams", type=int, default=50, help="Solve streams during the rolling restart")
    parser.add_argument("--only", choices=sorted(CONFIGS), help="measure one configuration")
    args = parser.parse_args()
    results = {}
    with instant_policy_process() as url:
        for name, config in CONFIGS.items():
            if args.only in (None, name):
                with configured(config):
                    results[name] = asyncio.run(measure(url, args.streams, args.rolling_streams))
                print(json.dumps({name: results[name]}), flush=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
