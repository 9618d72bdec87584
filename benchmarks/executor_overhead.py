"""The executor's own overhead per episode and per turn, with the model taken out.

The policy is the ScriptedPolicy stand-in (answers instantly), so what remains is the
platform: gRPC hops, the policy HTTP call, parsing, accounting, scoring and the store write.
It is compared, in the same run and process, with the floor: a bare loopback gRPC unary
round-trip (health Check) times the number of hops the episode makes. Tool execution time
(reported by the sandbox) is subtracted: it is the tool's, not the executor's.

The floor is measured twice. Back to back to the executor, as before: every call finds the
server busy from the last one. And in turn to every service of the stack, as an episode's hops
go: each call finds its server idle since its last call, a few milliseconds ago. A gRPC server
woken from idle answers later (1.0-1.3 ms against 0.7-0.9 ms on stop 22's machine, where a raw socket pair
loses only tens of microseconds), so the second floor is what the same hops cost with nothing
else done, and the first one overstates how far the platform is from it.

With one process per service it also reports the CPU time each episode costs the executor
process and all service processes together (user + system): unlike the wall-clock ratio, that
figure hardly moves with other load on the machine, so it is the one to compare changes by.

    .venv/bin/python benchmarks/executor_overhead.py [--episodes 200] [--postgres URL] [--in-process]

Goal (issues 3 and 13): overhead at most 1.5x the floor.

With --tracing it measures instead what tracing costs an episode (issue 51): three in-process
platforms, tracing off, on at ratio 1.0 and on at ratio 0.1, started together and their episodes
taken in turn (so the machine's drift falls on all three alike), the spans exported over OTLP/gRPC
to a receiver in this process as they would go to a collector.

    .venv/bin/python benchmarks/executor_overhead.py --tracing [--episodes 200]

With --tls, the same for TLS (issue 51): plaintext against TLS and mutual TLS on every gRPC hop.

    .venv/bin/python benchmarks/executor_overhead.py --tls [--episodes 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import psutil

from gearshift.api.common.v1.common_pb2 import Mode
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift import tracing
from gearshift.clients import channel
from gearshift.settings import Settings, TracingSettings
from gearshift.stack import Stack
from gearshift.topology import GRPC_SERVICE_NAMES
from gearshift.testing.certs import StackCertificate, issue
from gearshift.testing.otlp_receiver import OtlpReceiver
from gearshift.testing.scripted_policy import instant_policy, serve_scripted
from gearshift.embedded import embedded
from grpc_health.v1 import health_pb2, health_pb2_grpc

WARM_UP = 10  # episodes run before the measured ones (their CPU is counted, their latency not)
BASE_PORT = 23100  # seven consecutive ports for the one-process-per-service stack, below the ephemeral range

# Round-trips on the critical path of each episode shape: client->executor, executor->router,
# executor->policy per turn, executor->planner->policy per agentic turn (Regulate answers ACT, so
# no Plan call), executor->sandbox per tool call, executor->store (Put; no reference, no reward).
# A tagged request names its trajectory id, as evaluation, rollouts and teaching do: the executor
# first asks the store whether it already ran (Get), one call more (the floor counts it, though
# the executor overlaps it with routing).
SHAPES = {
    "instant": {"mode": Mode.MODE_INSTANT, "hops": 1 + 1 + 1 + 1, "turns": 1},
    "instant, tagged": {"mode": Mode.MODE_INSTANT, "hops": 1 + 1 + 1 + 1 + 1, "turns": 1, "tagged": True},
    "agentic (1 tool turn + answer)": {"mode": Mode.MODE_AGENTIC, "hops": 1 + 1 + 2 * (1 + 2) + 1 + 1, "turns": 2},
}


async def bare_rtt(addresses: list[str], settings: Settings, n: int) -> float:
    """Median health Check round-trip, the calls going to the addresses in turn."""
    async with contextlib.AsyncExitStack() as stack:
        stubs = [health_pb2_grpc.HealthStub(await stack.enter_async_context(channel(a, settings))) for a in addresses]
        for index in range(50 * len(stubs)):
            await stubs[index % len(stubs)].Check(health_pb2.HealthCheckRequest())
        samples = []
        for index in range(n):
            started = time.perf_counter()
            await stubs[index % len(stubs)].Check(health_pb2.HealthCheckRequest())
            samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def cpu_seconds(processes: dict[str, psutil.Process]) -> dict[str, float]:
    """User + system CPU so far of each service process and its live children (sandbox workers)."""
    def of(process: psutil.Process) -> float:
        total = 0.0
        for one in [process, *process.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = one.cpu_times()
                total += times.user + times.system
        return total
    return {name: of(process) for name, process in processes.items()}


async def episode_times(settings: Settings, mode: int, n: int, tagged: bool = False) -> tuple[float, float]:
    """Median episode latency and median tool time, in seconds."""
    latencies, tool_times = [], []
    async with channel(settings.executor_addr, settings) as ch:
        stub = executor_pb2_grpc.ExecutorStub(ch)
        for index in range(n + WARM_UP):
            started = time.perf_counter()
            request = executor_pb2.SolveRequest(query="What is the capital of France?", mode=mode)
            if tagged:
                request.trajectory_id = str(uuid.uuid4())
            async for item in stub.Solve(request):
                final = item
            elapsed = time.perf_counter() - started
            trajectory = final.final.trajectory
            tools = sum(r.wall_seconds for turn in trajectory.turns for r in turn.tool_results)
            if index >= WARM_UP:
                latencies.append(elapsed)
                tool_times.append(tools)
    return statistics.median(latencies), statistics.median(tool_times)


async def measure(stack: Settings, episodes: int, processes: dict[str, psutil.Process] | None = None) -> None:
    rtt = await bare_rtt([stack.executor_addr], stack, episodes * 5)
    in_turn = await bare_rtt([stack.address_of(name) for name in GRPC_SERVICE_NAMES], stack, episodes * 5)
    print(f"bare loopback gRPC round-trip (median of {episodes * 5}): back to back to the executor {rtt * 1e3:.3f} ms,"
          f" in turn to the {len(GRPC_SERVICE_NAMES)} gRPC services {in_turn * 1e3:.3f} ms")
    print(f"{'episode':<32} {'hops':>4} {'median ms':>10} {'tool ms':>8} {'overhead ms':>12} {'floor ms':>9} {'ratio':>6}"
          f" {'in turn ms':>11} {'ratio':>6} {'per turn ms':>12}" + (f" {'executor cpu ms':>16} {'services cpu ms':>16}" if processes else ""))
    for name, shape in SHAPES.items():
        before = cpu_seconds(processes) if processes else {}
        latency, tools = await episode_times(stack, shape["mode"], episodes, shape.get("tagged", False))
        overhead = latency - tools
        floor, floor_in_turn = rtt * shape["hops"], in_turn * shape["hops"]
        line = (f"{name:<32} {shape['hops']:>4} {latency * 1e3:>10.2f} {tools * 1e3:>8.2f} {overhead * 1e3:>12.2f}"
                f" {floor * 1e3:>9.2f} {overhead / floor:>6.2f} {floor_in_turn * 1e3:>11.2f} {overhead / floor_in_turn:>6.2f}"
                f" {overhead / shape['turns'] * 1e3:>12.2f}")
        if processes:
            spent = {key: value - before[key] for key, value in cpu_seconds(processes).items()}
            per_episode = 1e3 / (episodes + WARM_UP)
            line += f" {spent['executor'] * per_episode:>16.2f} {sum(spent.values()) * per_episode:>16.2f}"
        print(line)


def tracing_variants(receiver: OtlpReceiver) -> dict[str, dict]:
    """Tracing off, on at ratio 1.0 and at 0.1, exporting to the receiver."""
    return {name: {"tracing": TracingSettings(enabled=ratio is not None, otlp_endpoint=receiver.endpoint, sample_ratio=ratio or 1.0)}
            for name, ratio in {"off": None, "on, ratio 1.0": 1.0, "on, ratio 0.1": 0.1}.items()}


def tls_variants(certificate: StackCertificate) -> dict[str, dict]:
    """Plaintext, TLS, and mutual TLS on every gRPC hop (the stand-in policy stays plaintext HTTP)."""
    return {"plaintext": {}, "TLS": {"tls": certificate.settings()}, "mutual TLS": {"tls": certificate.settings(client_auth=True)}}


async def one_episode(stub: executor_pb2_grpc.ExecutorStub, mode: int, tagged: bool) -> float:
    request = executor_pb2.SolveRequest(query="What is the capital of France?", mode=mode, trajectory_id=str(uuid.uuid4()) if tagged else "")
    started = time.perf_counter()
    async for _ in stub.Solve(request):
        pass
    return time.perf_counter() - started


async def side_by_side(settings: Settings, variants: dict[str, dict], episodes: int) -> None:
    """One in-process platform per variant (a settings update), started together, their episodes
    taken in turn (so the machine's drift falls on all alike); the median of each and its ratio
    to the first variant's."""
    async with contextlib.AsyncExitStack() as stack:
        stubs = {}
        for name, update in variants.items():
            own = settings.model_copy(update=update | {"data_dir": Path(tempfile.mkdtemp(prefix="gearshift-bench-"))})
            platform = await stack.enter_async_context(embedded(own))
            stubs[name] = executor_pb2_grpc.ExecutorStub(await stack.enter_async_context(channel(platform.settings.executor_addr, own)))
        base, *others = variants
        print(f"{'episode':<32} " + " ".join(f"{name + ' ms':>16}" for name in variants) + " " + " ".join(f"{name + '/' + base:>22}" for name in others))
        for shape_name, shape in SHAPES.items():
            samples: dict[str, list[float]] = {name: [] for name in variants}
            for index in range(episodes + WARM_UP):
                turn = index % len(variants)
                for name in list(variants)[turn:] + list(variants)[:turn]:  # each goes first in turn
                    elapsed = await one_episode(stubs[name], shape["mode"], shape.get("tagged", False))
                    if index >= WARM_UP:
                        samples[name].append(elapsed)
            medians = {name: statistics.median(values) for name, values in samples.items()}
            print(f"{shape_name:<32} " + " ".join(f"{value * 1e3:>16.2f}" for value in medians.values())
                  + " " + " ".join(f"{medians[name] / medians[base]:>22.3f}" for name in others))


async def main(episodes: int, postgres: str | None, in_process: bool, traced: bool = False, tls: bool = False) -> None:
    settings = Settings(data_dir=tempfile.mkdtemp(prefix="gearshift-bench-"), metrics_port=0, database_url=postgres)
    print(f"store: {'Postgres' if postgres else 'SQLite file'}; policy: ScriptedPolicy stand-in (answers instantly)")
    async with serve_scripted(instant_policy) as policy_url:
        settings = settings.with_policy(policy_url)
        if traced:
            print("services: three platforms in this process (tracing off, on at 1.0, on at 0.1), one event loop")
            with OtlpReceiver() as receiver:
                await side_by_side(settings, tracing_variants(receiver), episodes)
                await asyncio.to_thread(tracing.flush)
                print(f"spans received by the OTLP receiver: {len(receiver.spans)} in {len({s.trace_id for s in receiver.spans})} traces")
            return
        if tls:
            print("services: three platforms in this process (plaintext, TLS, mutual TLS), one event loop")
            with tempfile.TemporaryDirectory(prefix="gearshift-bench-tls-") as folder:
                await side_by_side(settings, tls_variants(issue(Path(folder))), episodes)
            return
        if in_process:
            print("services: all in this process, one event loop")
            async with embedded(settings) as platform:
                stack = platform.settings
                await measure(stack, episodes)
            return
        print("services: one process each, as deployed (gearshift up)")
        stack = Stack(settings, base_port=BASE_PORT, with_policy=False)
        stack.start()
        try:
            await asyncio.to_thread(stack.wait_ready)
            processes = {name: psutil.Process(process.pid) for name, process in stack.processes.items()}
            await measure(stack.client_settings(), episodes, processes)
        finally:
            stack.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=200, help="Measured episodes per shape")
    parser.add_argument("--postgres", default=None, help="Store on this Postgres URL instead of a SQLite file")
    parser.add_argument("--in-process", action="store_true", help="All services in this process instead of one each")
    parser.add_argument("--tracing", action="store_true", help="Tracing off against on at ratio 1.0 and 0.1 (in process)")
    parser.add_argument("--tls", action="store_true", help="Plaintext against TLS and mutual TLS (in process)")
    args = parser.parse_args()
    asyncio.run(main(args.episodes, args.postgres, args.in_process, args.tracing, args.tls))
