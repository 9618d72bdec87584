"""Sandbox latency benchmark (not a test).

Starts the sandbox service as its own process, in each mode, and measures over gRPC on loopback:
- root: the service as root (the embedded stack), every call in its own namespaces, allowlisted
  root, seccomp filter and per-call cgroups;
- unprivileged: the service as uid 65534 (the chart's pod), the same isolation through user
  namespaces (started through tests/services/sandbox/as_nobody.py, which makes the interpreter
  reachable for that user and drops to it);
and in each mode:
- warm: a trivial snippet (`print(1)`) on a warm worker: calls paced (--pace-ms, default 50 ms)
  so the pool has refilled, i.e. the isolation was built off the request path, as a tool call in
  an episode finds it (the goal: p50 <= 5 ms, p99 <= 10 ms); a bare gRPC round-trip is timed
  between every two calls, so its p99 shows the tail the machine itself adds;
- back to back: the same without pause, so once the warm workers are used up every call waits
  for a worker to be built (the cost of the isolation itself, bounded by how fast the zygote
  builds workers on this machine);
- session: the same snippet in a declared session (one worker kept between calls);
- concurrent: 8 callers at once (throughput).
Next to floors measured in the same run: `python -S -I -c pass` start-up, fork+exit+wait of a
warm process, and a bare gRPC round-trip (ListTools) to the same service. The machine is shared
and noisy: every figure is the median over --repeats runs, modes interleaved within each run.

    .venv/bin/python benchmarks/sandbox_latency.py [--calls 300] [--pace-ms 50] [--repeats 3] [--json]
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
from pathlib import Path

import grpc
from gearshift.api.common.v1.common_pb2 import ToolCall
from gearshift.api.sandbox.v1 import sandbox_pb2, sandbox_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

AS_NOBODY = Path(__file__).resolve().parents[1] / "tests/services/sandbox/as_nobody.py"
NOBODY = 65534
GOAL_P50_MS, GOAL_P99_MS = 5.0, 10.0

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


async def timed_calls(stub, n: int, session_id: str = "", pace: float = 0.0) -> list[float]:
    samples = []
    for _ in range(n):
        if pace:
            await asyncio.sleep(pace)
        started = time.perf_counter()
        reply = await stub.Execute(request("print(1)", session_id))
        samples.append(time.perf_counter() - started)
        if reply.result.is_error or reply.result.output != "1\n":
            raise RuntimeError(f"unexpected result: {reply.result}")
    return samples


async def timed_roundtrip(stub) -> float:
    started = time.perf_counter()
    await stub.ListTools(sandbox_pb2.ListToolsRequest())
    return time.perf_counter() - started


async def timed_warm_calls(stub, n: int, pace: float) -> tuple[list[float], list[float]]:
    """Paced trivial calls, each half a pause after a bare round-trip: (calls, round-trips)."""
    calls, rpc = [], []
    for _ in range(n):
        await asyncio.sleep(pace / 2)
        rpc.append(await timed_roundtrip(stub))
        calls += await timed_calls(stub, 1, pace=pace / 2)
    return calls, rpc


async def measure(address: str, calls: int, concurrency: int, pace: float) -> dict:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = sandbox_pb2_grpc.SandboxStub(ch)
        rpc = [await timed_roundtrip(stub) for _ in range(200)]
        await timed_warm_calls(stub, 10, pace)  # warm-up
        warm, paced_rpc = await timed_warm_calls(stub, calls, pace)
        await asyncio.sleep(1.0)  # let the pool refill
        back_to_back = await timed_calls(stub, calls)
        await timed_calls(stub, 3, session_id="bench-session")
        session = await timed_calls(stub, calls, session_id="bench-session")
        await stub.CloseSession(sandbox_pb2.CloseSessionRequest(session_id="bench-session"))
        await asyncio.sleep(1.0)

        started = time.perf_counter()
        per_caller = await asyncio.gather(*(timed_calls(stub, calls // concurrency) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    loaded = [s for caller in per_caller for s in caller]
    ms = 1000
    return {
        "grpc_roundtrip_p50_ms": ms * statistics.median(rpc),
        "paced_grpc_roundtrip_p99_ms": ms * percentile(paced_rpc, 0.99),
        "warm_p50_ms": ms * statistics.median(warm), "warm_p99_ms": ms * percentile(warm, 0.99),
        "back_to_back_p50_ms": ms * statistics.median(back_to_back), "back_to_back_p99_ms": ms * percentile(back_to_back, 0.99),
        "session_p50_ms": ms * statistics.median(session), "session_p99_ms": ms * percentile(session, 0.99),
        f"concurrent{concurrency}_calls_per_s": len(loaded) / elapsed,
        f"concurrent{concurrency}_p50_ms": ms * statistics.median(loaded),
    }


def start_service(mode: str, port: int, data_dir: str, warm_workers: int) -> subprocess.Popen:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": data_dir,
        "GEARSHIFT_PORT": str(port), "GEARSHIFT_METRICS_PORT": "0", "GEARSHIFT_DATA_DIR": data_dir,
        "GEARSHIFT_SANDBOX__WARM_WORKERS": str(warm_workers), "GEARSHIFT_LOG_LEVEL": "WARNING",
    }
    launcher = [sys.executable, str(AS_NOBODY), "--"] if mode == "unprivileged" else []
    if mode == "unprivileged":
        os.chown(data_dir, NOBODY, NOBODY)
    return subprocess.Popen([*launcher, sys.executable, "-m", "gearshift.services.sandbox"], env=env, cwd=data_dir)


def run_mode(mode: str, args) -> dict:
    port = free_port()
    with tempfile.TemporaryDirectory() as data_dir:
        service = start_service(mode, port, data_dir, args.warm_workers)
        try:
            address = f"127.0.0.1:{port}"
            asyncio.run(wait_serving(address, time.monotonic() + 60))
            return asyncio.run(measure(address, args.calls, args.concurrency, args.pace_ms / 1000))
        finally:
            service.terminate()
            service.wait(timeout=10)


def summarize(runs: list[dict]) -> dict:
    """Per figure, the median over repeats."""
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300, help="calls per measurement")
    parser.add_argument("--pace-ms", type=float, default=50.0, help="pause before each warm call: time to build the next worker")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent callers for throughput")
    parser.add_argument("--warm-workers", type=int, default=8, help="GEARSHIFT_SANDBOX__WARM_WORKERS for the service")
    parser.add_argument("--repeats", type=int, default=3, help="runs; every figure is the median over them")
    parser.add_argument("--modes", default="root,unprivileged", help="root (needs root), unprivileged")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if os.geteuid() != 0:
        modes = ["unprivileged"] if "unprivileged" in modes else []
        print("not root: the service runs as this user, in the unprivileged mode only", file=sys.stderr)

    floors, per_mode = [], {mode: [] for mode in modes}
    for _ in range(args.repeats):
        floors.append({"python_startup_p50_ms": 1000 * interpreter_startup_floor(30), "fork_p50_ms": 1000 * fork_floor(300)})
        for mode in modes:
            per_mode[mode].append(run_mode(mode, args))
    figures: dict = {**summarize(floors), "cpus": os.cpu_count(), "warm_workers": args.warm_workers, "repeats": args.repeats}
    for mode, runs in per_mode.items():
        mode_figures = summarize(runs)
        mode_figures["warm_p50_over_python_startup"] = mode_figures["warm_p50_ms"] / figures["python_startup_p50_ms"]
        mode_figures["warm_p50_over_grpc_roundtrip"] = mode_figures["warm_p50_ms"] / mode_figures["grpc_roundtrip_p50_ms"]
        mode_figures["warm_p99_over_paced_grpc_p99"] = mode_figures["warm_p99_ms"] / mode_figures["paced_grpc_roundtrip_p99_ms"]
        mode_figures["goal_met"] = mode_figures["warm_p50_ms"] <= GOAL_P50_MS and mode_figures["warm_p99_ms"] <= GOAL_P99_MS
        mode_figures["warm_p99_ms_per_run"] = " ".join(f"{run['warm_p99_ms']:.1f}" for run in runs)
        figures[mode] = mode_figures
    if args.json:
        print(json.dumps(_rounded(figures)))
        return
    print_table(figures, modes)


def _rounded(value):
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return round(value, 2) if isinstance(value, float) else value


def print_table(figures: dict, modes: list[str]) -> None:
    for name in ("python_startup_p50_ms", "fork_p50_ms", "cpus", "warm_workers", "repeats"):
        print(f"{name:<34}  {figures[name]:10.2f}" if isinstance(figures[name], float) else f"{name:<34}  {figures[name]:10}")
    if not modes:
        return
    print(f"{'':<34}  " + "  ".join(f"{mode:>12}" for mode in modes))
    for name in figures[modes[0]]:
        cells = [figures[mode][name] for mode in modes]
        print(f"{name:<34}  " + "  ".join(f"{v:12.2f}" if isinstance(v, float) else f"{v!s:>12}" for v in cells))
    print(f"goal: warm p50 <= {GOAL_P50_MS:g} ms and p99 <= {GOAL_P99_MS:g} ms in every mode")


if __name__ == "__main__":
    main()
