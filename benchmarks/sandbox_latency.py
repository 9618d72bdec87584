"""Sandbox latency benchmark (not a test).

Starts the sandbox service as its own process with full isolation and measures, over gRPC on
loopback: the latency of a trivial python snippet (p50, p99) back to back, the same on a warm
session, and throughput with 8 concurrent callers; next to floors measured in the same run:
`python -S -I -c pass` start-up, fork+exit+wait of a warm process, and a bare gRPC round-trip
(ListTools) to the same service.

    .venv/bin/python benchmarks/sandbox_latency.py [--calls 300] [--concurrency 8] [--json]

Goal (issue 4): trivial-snippet p50 <= 15 ms with full isolation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import grpc
from gearshift.api.common.v1.common_pb2 import ToolCall
from gearshift.api.sandbox.v1 import sandbox_pb2, sandbox_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

FORK_FLOOR_SCRIPT = """
import os, time, statistics
samples = []
for _ in range({n}):
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    samples.append(time.perf_counter() - t)
print(statistics.median(samples))
"""


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def interpreter_startup_floor(n: int) -> float:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-S", "-I", "-c", "pass"], check=True)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def fork_floor(n: int) -> float:
    out = subprocess.run([sys.executable, "-S", "-I", "-c", FORK_FLOOR_SCRIPT.format(n=n)], capture_output=True, text=True, check=True)
    return float(out.stdout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_serving(address: str, deadline: float) -> None:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError("sandbox did not start")


def request(code: str, session_id: str = "") -> sandbox_pb2.ExecuteRequest:
    return sandbox_pb2.ExecuteRequest(
        call=ToolCall(id="b", name="python", arguments_json=json.dumps({"code": code})), trajectory_id="bench", session_id=session_id
    )


async def timed_calls(stub, n: int, session_id: str = "") -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        reply = await stub.Execute(request("print(1)", session_id))
        samples.append(time.perf_counter() - started)
        if reply.result.is_error or reply.result.output != "1\n":
            raise RuntimeError(f"unexpected result: {reply.result}")
    return samples


async def measure(address: str, calls: int, concurrency: int) -> dict:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = sandbox_pb2_grpc.SandboxStub(ch)
        rpc = []
        for _ in range(200):
            started = time.perf_counter()
            await stub.ListTools(sandbox_pb2.ListToolsRequest())
            rpc.append(time.perf_counter() - started)
        await timed_calls(stub, 10)  # warm-up
        await asyncio.sleep(0.5)  # let the pool refill
        one_shot = await timed_calls(stub, calls)
        await timed_calls(stub, 3, session_id="bench-session")
        session = await timed_calls(stub, calls, session_id="bench-session")
        await stub.CloseSession(sandbox_pb2.CloseSessionRequest(session_id="bench-session"))
        await asyncio.sleep(0.5)

        started = time.perf_counter()
        per_caller = await asyncio.gather(*(timed_calls(stub, calls // concurrency) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    loaded = [s for caller in per_caller for s in caller]
    return {
        "grpc_roundtrip_p50_ms": 1000 * statistics.median(rpc),
        "trivial_p50_ms": 1000 * statistics.median(one_shot),
        "trivial_p99_ms": 1000 * percentile(one_shot, 0.99),
        "session_p50_ms": 1000 * statistics.median(session),
        "session_p99_ms": 1000 * percentile(session, 0.99),
        f"concurrent{concurrency}_calls_per_s": len(loaded) / elapsed,
        f"concurrent{concurrency}_p50_ms": 1000 * statistics.median(loaded),
        f"concurrent{concurrency}_p99_ms": 1000 * percentile(loaded, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300, help="calls per measurement")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent callers for throughput")
    parser.add_argument("--warm-workers", type=int, default=8, help="GEARSHIFT_SANDBOX__WARM_WORKERS for the service")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    floors = {"python_startup_p50_ms": 1000 * interpreter_startup_floor(30), "fork_p50_ms": 1000 * fork_floor(300)}
    port = free_port()
    with tempfile.TemporaryDirectory() as data_dir:
        env = {
            **os.environ, "GEARSHIFT_PORT": str(port), "GEARSHIFT_METRICS_PORT": "0", "GEARSHIFT_DATA_DIR": data_dir,
            "GEARSHIFT_SANDBOX__WARM_WORKERS": str(args.warm_workers), "GEARSHIFT_LOG_LEVEL": "WARNING",
        }
        service = subprocess.Popen([sys.executable, "-m", "gearshift.services.sandbox"], env=env)
        try:
            address = f"127.0.0.1:{port}"
            asyncio.run(wait_serving(address, time.monotonic() + 30))
            figures = asyncio.run(measure(address, args.calls, args.concurrency))
        finally:
            service.terminate()
            service.wait(timeout=10)
    figures = {**floors, **figures, "cpus": os.cpu_count(), "warm_workers": args.warm_workers}
    if args.json:
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in figures.items()}))
        return
    width = max(map(len, figures))
    for name, value in figures.items():
        print(f"{name:<{width}}  {value:8.2f}" if isinstance(value, float) else f"{name:<{width}}  {value:8}")


if __name__ == "__main__":
    main()
