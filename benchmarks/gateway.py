"""The OpenAI-compatible gateway's own cost: the latency it adds to a request against calling
executor.Solve directly, and completions/s through it at 64 concurrent streams.

The services run one process each, as `gearshift up` runs them (the gateway among them), the
store on a scratch Postgres database; the policy is the ScriptedPolicy stand-in in a process of
its own (every mode answers at once), so what is measured is the platform, not a model. Each
episode is a forced instant answer to the same question.

- Latency: requests one at a time, alternating a direct Solve stream (gRPC, as the gateway
  makes it) with the same episode through the gateway by the official `openai` client, plain
  and streamed (to the last chunk); p50 and p99 of each, side by side, and the differences.
- Throughput: --streams concurrent streamed completions through the gateway for --seconds after
  a warm-up, then the same concurrency of direct Solve streams; completions/s and errors (any
  failure, or an episode that did not complete), and the CPU each completion cost each process
  (the services', and the clients' in this one: the openai client's against gRPC's).

    .venv/bin/python benchmarks/gateway.py [--requests 300] [--streams 64] [--seconds 20]

With --tracing it measures instead what tracing costs a request through the gateway (issue 51):
three stacks, tracing off, on at ratio 1.0 and on at ratio 0.1, their requests taken in turn, the
spans exported over OTLP/gRPC to a receiver in this process.

    .venv/bin/python benchmarks/gateway.py --tracing [--requests 300]

Goals: no errors at 64 streams; the gateway adds a few milliseconds at most per request.
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
from collections.abc import Awaitable, Callable

import grpc
import openai
import psutil
from gearshift.api.common.v1.common_pb2 import Mode, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.clients import channel
from gearshift.settings import Settings
from gearshift.stack import Stack
from gearshift.testing.otlp_receiver import OtlpReceiver
from gearshift.testing.ports import free_port
from gearshift.testing.postgres import scratch_database
from gearshift.testing.scripted_policy import instant_policy_process

BASE_PORT = 23700  # below the ephemeral range (32768-60999): no client socket can hold it
QUESTION = "What is the capital of France?"
WARM_UP = 20  # requests of each kind before the measured ones
STREAMS_PER_CHANNEL = 50


# One request of each kind: it raises unless the episode completed.


def direct(stub: executor_pb2_grpc.ExecutorStub) -> Callable[[], Awaitable[None]]:
    async def solve() -> None:
        final = None
        async for event in stub.Solve(executor_pb2.SolveRequest(query=QUESTION, mode=Mode.MODE_INSTANT)):
            final = event if event.HasField("final") else final
        if final is None or final.final.trajectory.status != TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED:
            raise RuntimeError("the episode did not complete")
    return solve


def plain(client: openai.AsyncOpenAI) -> Callable[[], Awaitable[None]]:
    async def complete() -> None:
        completion = await client.chat.completions.create(model="gearshift-instant", messages=[{"role": "user", "content": QUESTION}])
        if completion.choices[0].finish_reason != "stop":
            raise RuntimeError(f"finish_reason {completion.choices[0].finish_reason}")
    return complete


def streamed(client: openai.AsyncOpenAI) -> Callable[[], Awaitable[None]]:
    async def complete() -> None:
        stream = await client.chat.completions.create(model="gearshift-instant", messages=[{"role": "user", "content": QUESTION}], stream=True)
        finish = [chunk.choices[0].finish_reason async for chunk in stream if chunk.choices and chunk.choices[0].finish_reason]
        if finish != ["stop"]:
            raise RuntimeError(f"finish_reason {finish}")
    return complete


def percentile(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def latencies(kinds: dict[str, Callable[[], Awaitable[None]]], requests: int) -> dict[str, dict[str, float]]:
    """Each kind in turn, one request at a time, so every kind sees the same machine."""
    samples: dict[str, list[float]] = {name: [] for name in kinds}
    for index in range(requests + WARM_UP):
        for name, request in kinds.items():
            started = time.perf_counter()
            await request()
            if index >= WARM_UP:
                samples[name].append(time.perf_counter() - started)
    return {name: {"p50_ms": statistics.median(values) * 1e3, "p99_ms": percentile(values, 0.99) * 1e3} for name, values in samples.items()}


def cpu_seconds(processes: dict[str, psutil.Process]) -> dict[str, float]:
    """User + system CPU so far of each process."""
    return {name: sum(process.cpu_times()[:2]) for name, process in processes.items()}


async def throughput(request: Callable[[], Awaitable[None]], streams: int, seconds: float, warmup: float,
                     processes: dict[str, psutil.Process]) -> dict:
    done, errors, before = 0, Counter(), {}
    begun = time.perf_counter()
    measured_from, deadline = begun + warmup, begun + warmup + seconds

    async def worker() -> None:
        nonlocal done
        while (now := time.perf_counter()) < deadline:
            try:
                await request()
            except (openai.APIError, grpc.aio.AioRpcError, RuntimeError) as exc:
                errors[f"{type(exc).__name__}: {str(exc)[:100]}"] += 1
                continue
            done += now >= measured_from

    async def mark() -> None:
        await asyncio.sleep(warmup)
        before.update(cpu_seconds(processes))

    await asyncio.gather(mark(), *(worker() for _ in range(streams)))
    elapsed = time.perf_counter() - measured_from
    spent = {name: value - before[name] for name, value in cpu_seconds(processes).items()}
    return {"completions": done, "per_second": round(done / elapsed, 1), "errors": sum(errors.values()), "error_kinds": dict(errors),
            "cpu_ms_per_completion": {name: round(value * 1e3 / max(done, 1), 2) for name, value in spent.items()}}


async def measure(settings: Settings, args: argparse.Namespace, processes: dict[str, psutil.Process]) -> dict:
    async with contextlib.AsyncExitStack() as exits:
        channels = [await exits.enter_async_context(channel(settings.executor_addr, settings))
                    for _ in range(max(1, args.streams // STREAMS_PER_CHANNEL))]
        stubs = [executor_pb2_grpc.ExecutorStub(ch) for ch in channels]
        client = await exits.enter_async_context(openai.AsyncOpenAI(
            base_url=f"http://{settings.gateway_addr}/v1", api_key="unused", max_retries=0, timeout=60))
        figures = {"latency": await latencies({"solve": direct(stubs[0]), "gateway": plain(client), "gateway streamed": streamed(client)},
                                              args.requests)}
        solve = figures["latency"]["solve"]
        figures["added_ms"] = {kind: {q: round(figures["latency"][kind][q] - solve[q], 3) for q in ("p50_ms", "p99_ms")}
                               for kind in ("gateway", "gateway streamed")}
        figures["latency"] = {kind: {q: round(v, 3) for q, v in values.items()} for kind, values in figures["latency"].items()}
        figures["throughput"] = {
            "gateway streamed": await throughput(streamed(client), args.streams, args.seconds, args.warmup_seconds, processes),
            "solve": await throughput(_rotating(stubs), args.streams, args.seconds, args.warmup_seconds, processes),
        }
    return figures


TRACING = {"off": None, "on, ratio 1.0": 1.0, "on, ratio 0.1": 0.1}


def tracing_figures(args: argparse.Namespace, database_url: str, policy_url: str) -> dict:
    """p50 and p99 of a plain completion through the gateway of each of three stacks (tracing off,
    on at 1.0, on at 0.1), one request of each in turn; the spans the receiver got.

    Every stack is spawned before this process runs any gRPC (the receiver, the health checks):
    a process forked while gRPC's threads run can abort in the child before it execs."""
    endpoint_port = free_port()
    with contextlib.ExitStack() as exits:
        stacks = {}
        for offset, (name, ratio) in enumerate(TRACING.items()):
            traced = {"GEARSHIFT_TRACING__ENABLED": str(ratio is not None).lower(),
                      "GEARSHIFT_TRACING__OTLP_ENDPOINT": f"http://127.0.0.1:{endpoint_port}", "GEARSHIFT_TRACING__SAMPLE_RATIO": str(ratio or 1.0)}
            os.environ.update(traced)  # the service processes read their settings from the environment
            settings = Settings(data_dir=tempfile.mkdtemp(prefix="gearshift-gateway-bench-"), database_url=database_url).with_policy(
                policy_url, "smollm2")
            stacks[name] = Stack(settings, base_port=BASE_PORT + 10 * offset, with_policy=False)
            stacks[name].start()  # its processes die with this one, should the next start fail
        for key in traced:
            del os.environ[key]
        receiver = exits.enter_context(OtlpReceiver(endpoint_port))
        for stack in stacks.values():  # stopped before the receiver: their last spans still arrive
            exits.callback(stack.stop)
        gateways = {}
        for name, stack in stacks.items():
            if any(state != "SERVING" for _, state in stack.wait_ready().values()):
                raise RuntimeError(f"the {name} stack did not come up")
            gateways[name] = stack.client_settings().gateway_addr

        async def measure_each() -> dict:
            async with contextlib.AsyncExitStack() as clients:
                kinds = {}
                for name, address in gateways.items():
                    client = await clients.enter_async_context(openai.AsyncOpenAI(
                        base_url=f"http://{address}/v1", api_key="unused", max_retries=0, timeout=60))
                    kinds[name] = plain(client)
                return await latencies(kinds, args.requests)

        latency = asyncio.run(measure_each())
        spans = list(receiver.spans)
    off = latency["off"]
    return {"tracing_latency": {name: {q: round(v, 3) for q, v in values.items()} for name, values in latency.items()},
            "ratio_to_off": {name: {q: round(values[q] / off[q], 3) for q in values} for name, values in latency.items()},
            "spans_received": len(spans), "traces_received": len({span.trace_id for span in spans})}


def _rotating(stubs: list[executor_pb2_grpc.ExecutorStub]) -> Callable[[], Awaitable[None]]:
    requests = itertools.cycle([direct(stub) for stub in stubs])
    return lambda: next(requests)()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="measured requests of each kind for the latency")
    parser.add_argument("--streams", type=int, default=64, help="concurrent streams for the throughput")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds of each throughput run")
    parser.add_argument("--warmup-seconds", type=float, default=3.0, help="load before each measured run (not counted)")
    parser.add_argument("--tracing", action="store_true", help="Latency with tracing off against on at ratio 1.0 and 0.1")
    args = parser.parse_args()
    with scratch_database("gearshift_gateway_bench") as database_url, contextlib.ExitStack() as exits:
        os.environ["GEARSHIFT_DATABASE_URL"] = database_url  # the service processes read their settings from the environment
        os.environ["GEARSHIFT_LOG_LEVEL"] = "WARNING"
        url = exits.enter_context(instant_policy_process())
        if args.tracing:
            figures = tracing_figures(args, database_url, url) | {"requests": args.requests, "policy": "ScriptedPolicy stand-in",
                                                                  "load_average_1min": round(os.getloadavg()[0], 2)}
            print(json.dumps(figures, indent=2))
            return
        settings = Settings(data_dir=tempfile.mkdtemp(prefix="gearshift-gateway-bench-"), database_url=database_url).with_policy(url, "smollm2")
        stack = Stack(settings, base_port=BASE_PORT, with_policy=False)
        stack.start()
        exits.callback(stack.stop)
        health = stack.wait_ready()
        if any(state != "SERVING" for _, state in health.values()):
            raise RuntimeError(f"the stack did not come up: {health}")
        processes = {name: psutil.Process(process.pid) for name, process in stack.processes.items()}
        processes["client (this process)"] = psutil.Process()
        figures = asyncio.run(measure(stack.client_settings(), args, processes))
    figures |= {"requests": args.requests, "streams": args.streams, "policy": "ScriptedPolicy stand-in", "store": "Postgres",
                "load_average_1min": round(os.getloadavg()[0], 2)}
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
