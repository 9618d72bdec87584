"""Trajectory store ingest benchmark against the real Postgres (not a test).

Measures, in one run and against one fresh database:
  (a) the bare loopback gRPC unary round-trip (grpc.health.v1 Check on the store's server),
  (b) the median round-trip of a one-trajectory Put and of a Get through the store service,
  (c) the ingest rate of N realistic trajectories (~2.5 KB serialized: turns, tool calls and
      tool outputs) sent through the store service in batches by a few concurrent callers,
  (d) a bare psycopg executemany of the same rows into the same table (same batches, one
      commit per batch, one connection),
and prints the service/bare ratio (the goal: at least 0.5). Rates are medians over repeats,
with service and bare runs interleaved so drift on a shared machine hits both alike.

The store runs as its own process (`python -m gearshift.cli serve store`), as in production.

    .venv/bin/python benchmarks/store_ingest.py              # 10,000 trajectories, 3 repeats
    .venv/bin/python benchmarks/store_ingest.py --n 500      # quick mode, well under 20 s
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import grpc
import psycopg
from gearshift.api.common.v1.common_pb2 import (
    Cost,
    Mode,
    PlanDecision,
    PlanningStats,
    Reward,
    TokenUsage,
    ToolCall,
    ToolResult,
    Trajectory,
    TrajectoryStatus,
    Turn,
)
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.storage.codec import trajectory_row
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy.engine import make_url

DEFAULT_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
COLUMNS = (
    "id", "mode", "status", "correct", "reward_value", "task_source", "split", "run_id",
    "model_version", "created_at_us", "reward", "payload",
)
WORDS = (
    "the tool returns a value which we compare with the expected outcome before answering "
    "compute sum product ratio list search result page city population year author"
).split()


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def realistic_trajectory(rng: random.Random, created_us: int) -> Trajectory:
    """An agentic episode of about 2.5 KB: three turns, each with a python or search call and
    its output, then an answer, a reward, cost and labels."""
    trajectory = Trajectory(
        id=str(uuid.uuid4()),
        query=f"{words(rng, 22)}?",
        mode=Mode.MODE_AGENTIC,
        routing_rationale=words(rng, 10),
        answer=words(rng, 12),
        reference_answer=words(rng, 4),
        status=TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED,
        usage=TokenUsage(input_tokens=rng.randint(500, 4000), output_tokens=rng.randint(100, 900)),
        cost=Cost(total_usd=0.0004, input_usd=0.0002, output_usd=0.0001, tools_usd=0.0001),
        reward=Reward(value=rng.random(), correct=rng.random() < 0.6, format_valid=True, kind="apo", verifier="math",
                      components={"r_acc": 1.0, "r_format": 1.0, "r_adaptive": 0.75}),
        planning=PlanningStats(planning_frequency=0.33, mean_plan_depth=2.0, reasoning_tokens=420),
        task_source=rng.choice(["gsm_symbolic", "hotpotqa", "user"]),
        split=rng.choice(["train", "dev", "test"]),
        run_id=f"run-{rng.randint(1, 20)}",
        model_version="smollm2-base",
        labels={"domain": "math", "difficulty": "medium"},
        wall_seconds=rng.uniform(1, 30),
    )
    for index in range(3):
        tool = rng.choice(["python", "web_search"])
        call = ToolCall(id=str(index), name=tool, arguments_json=f'{{"code": "{words(rng, 14)}"}}')
        trajectory.turns.append(
            Turn(
                index=index,
                plan_decision=rng.choice([PlanDecision.PLAN_DECISION_PLAN_NEW, PlanDecision.PLAN_DECISION_ACT]),
                output=f"{words(rng, 45)} <tool_call>{{'id': {index}, 'name': '{tool}'}}</tool_call>",
                tool_calls=[call],
                tool_results=[ToolResult(call_id=call.id, name=tool, output=words(rng, 40), wall_seconds=0.05)],
                usage=TokenUsage(input_tokens=800, output_tokens=120),
                wall_seconds=rng.uniform(0.5, 5),
            )
        )
    trajectory.created_at.FromMicroseconds(created_us)
    return trajectory


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextlib.contextmanager
def fresh_database(server_url: str) -> Iterator[str]:
    """A new, empty database on the server, dropped at the end."""
    server = make_url(server_url)
    name = f"gearshift_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(libpq(server_url), autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(libpq(server_url), autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def store_process(database_url: str, port: int) -> Iterator[subprocess.Popen]:
    env = dict(os.environ, GEARSHIFT_DATABASE_URL=database_url, GEARSHIFT_PORT=str(port),
               GEARSHIFT_METRICS_PORT="0", GEARSHIFT_LOG_LEVEL="WARNING")
    env.pop("GEARSHIFT_AUTH_TOKEN", None)
    process = subprocess.Popen([sys.executable, "-m", "gearshift.cli", "serve", "store"], env=env)
    try:
        yield process
    finally:
        process.terminate()
        process.wait(timeout=30)


async def wait_serving(ch: grpc.aio.Channel, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    stub = health_pb2_grpc.HealthStub(ch)
    while True:
        if process.poll() is not None:
            raise RuntimeError("the store process exited during start-up")
        with contextlib.suppress(grpc.aio.AioRpcError):
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
        if time.monotonic() > deadline:
            raise TimeoutError("the store did not become SERVING")
        await asyncio.sleep(0.1)


async def median_round_trip(call, requests: list) -> float:
    """Median seconds of sequential calls (after a short warm-up)."""
    for request in requests[:20]:
        await call(request)
    samples = []
    for request in requests[20:]:
        started = time.perf_counter()
        await call(request)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


async def service_ingest(stub, batches: list[store_pb2.PutRequest], callers: int) -> tuple[float, int]:
    """Seconds to Put every batch with `callers` concurrent callers; and how many were inserted."""
    queue = list(reversed(batches))
    inserted = 0

    async def caller() -> None:
        nonlocal inserted
        while queue:
            reply = await stub.Put(queue.pop())
            inserted += reply.inserted

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return time.perf_counter() - started, inserted


def bare_ingest(database_url: str, rows: list[tuple], batch: int) -> float:
    """Seconds for psycopg executemany of the rows, one commit per batch, one connection."""
    sql = f"INSERT INTO trajectories ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * len(COLUMNS))})"
    with psycopg.connect(libpq(database_url)) as connection:
        started = time.perf_counter()
        for start in range(0, len(rows), batch):
            with connection.cursor() as cursor:
                cursor.executemany(sql, rows[start : start + batch])
            connection.commit()
        return time.perf_counter() - started


def empty_table(database_url: str) -> None:
    with psycopg.connect(libpq(database_url), autocommit=True) as connection:
        connection.execute("TRUNCATE checkpoint_trajectories, trajectories CASCADE")
        connection.execute("VACUUM ANALYZE trajectories")


def count_rows(database_url: str) -> int:
    with psycopg.connect(libpq(database_url)) as connection:
        return connection.execute("SELECT count(*) FROM trajectories").fetchone()[0]


async def run(args: argparse.Namespace) -> None:
    rng = random.Random(7)
    base_us = time.time_ns() // 1_000 - 10**9
    trajectories = [realistic_trajectory(rng, base_us + i) for i in range(args.n)]
    sizes = [t.ByteSize() for t in trajectories]
    batches = [
        store_pb2.PutRequest(trajectories=trajectories[s : s + args.batch]) for s in range(0, args.n, args.batch)
    ]
    rows = [tuple(trajectory_row(t)[c] for c in COLUMNS) for t in trajectories]
    samples = args.round_trips + 20

    with fresh_database(args.server_url) as database_url:
        port = free_port()
        with store_process(database_url, port) as process:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                await wait_serving(ch, process)
                health = health_pb2_grpc.HealthStub(ch)
                store = store_pb2_grpc.TrajectoryStoreStub(ch)

                bare_rtt = await median_round_trip(health.Check, [health_pb2.HealthCheckRequest()] * samples)
                singles = [realistic_trajectory(rng, base_us - 1_000_000 - i) for i in range(samples)]
                put_rtt = await median_round_trip(
                    store.Put, [store_pb2.PutRequest(trajectories=[t]) for t in singles]
                )
                get_rtt = await median_round_trip(
                    store.Get, [store_pb2.GetRequest(id=rng.choice(singles).id) for _ in range(samples)]
                )

                service_rates, bare_rates = [], []
                for _ in range(args.repeats):
                    empty_table(database_url)
                    seconds, inserted = await service_ingest(store, batches, args.callers)
                    if inserted != args.n or count_rows(database_url) != args.n:
                        raise RuntimeError(f"service stored {inserted} of {args.n}")
                    service_rates.append(args.n / seconds)

                    empty_table(database_url)
                    seconds = bare_ingest(database_url, rows, args.batch)
                    if count_rows(database_url) != args.n:
                        raise RuntimeError("bare insert lost rows")
                    bare_rates.append(args.n / seconds)

    service, bare = statistics.median(service_rates), statistics.median(bare_rates)
    runs = lambda rates: ", ".join(f"{r:,.0f}" for r in rates)  # noqa: E731
    print(
        f"store ingest into Postgres: {args.n:,} trajectories (mean {statistics.mean(sizes) / 1024:.2f} KB serialized), "
        f"batches of {args.batch}, {args.callers} concurrent callers, {args.repeats} repeats, "
        f"{args.round_trips} round-trips each"
    )
    table = [
        ("bare loopback gRPC round-trip (health Check)", f"{bare_rtt * 1e3:.3f} ms", ""),
        ("store Put round-trip (1 trajectory)", f"{put_rtt * 1e3:.3f} ms", ""),
        ("store Get round-trip", f"{get_rtt * 1e3:.3f} ms", ""),
        ("ingest through the store service (gRPC)", f"{service:,.0f} traj/s", runs(service_rates)),
        ("bare psycopg executemany, same rows/table", f"{bare:,.0f} rows/s", runs(bare_rates)),
        ("ratio service / bare (goal >= 0.5)", f"{service / bare:.2f}", ""),
    ]
    print(f"{'measure':<46} {'median':>16}   runs")
    for name, value, detail in table:
        print(f"{name:<46} {value:>16}   {detail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000, help="trajectories per ingest run")
    parser.add_argument("--batch", type=int, default=250, help="trajectories per Put (and per bare executemany)")
    parser.add_argument("--callers", type=int, default=4, help="concurrent Put callers")
    parser.add_argument("--repeats", type=int, default=3, help="ingest runs of each kind (median reported)")
    parser.add_argument("--round-trips", type=int, default=None, help="timed calls per round-trip median")
    parser.add_argument(
        "--server-url", default=os.environ.get("GEARSHIFT_BENCH_POSTGRES_URL", DEFAULT_SERVER),
        help="Postgres server to create the scratch database on",
    )
    args = parser.parse_args()
    if args.round_trips is None:
        args.round_trips = 1_000 if args.n >= 5_000 else 200
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
