"""What the gateway's admission control buys a well-behaved client while another key floods:
p50 and p99 latency of one key's completions, sent one at a time, through a gateway with the
per-key limits and through one without, with and without a flood from a second key.

The processes are laid out as a deployment lays them out, because the question is about
contention: with the flood's clients, the gateways and the services in one event loop (as this
benchmark first ran them), every instant refusal the limits hand out is also a turn of the loop
the measured request waits behind, and the limits looked worse for the tail than no limits.

- The platform: every service one process of its own, as `gearshift up` runs them
  (gearshift.stack.Stack), the store on a scratch Postgres database; its gateway has the limits
  (the flooding key: --rate requests a second, bursts of --rate, --concurrent in flight).
- A second gateway process in front of the same services, without limits (no rate, no bound in
  flight, no connection cap): the two conditions differ only in the admission layer.
- The policy: the ScriptedPolicy stand-in in its own process, answering every episode at once
  (an instant stub), so that what is measured is the gateway and the platform, not a model.
- The flood: one process of its own, --flooders httpx clients of the flooding key, each sending
  its next completion as soon as its last is answered, 429s included (a client that ignores
  Retry-After: the worst case for the gateway).
- The measured key: this process, one completion at a time.

The four conditions (limits on/off x flood/no flood) are taken in turn, --rounds times, the order
rotated each round so that none always follows a flood; each condition's p50 and p99 are its
median over the rounds. A condition stops at --requests completions or --condition-seconds,
whichever comes first (without limits under the flood a completion can take a second).

    .venv/bin/python benchmarks/admission.py [--rounds 5] [--requests 100] [--flooders 64]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil
from gearshift.services.gateway.api_keys import key_hash, new_key
from gearshift.settings import Settings
from gearshift.stack import Stack
from gearshift.testing.postgres import scratch_database
from gearshift.testing.scripted_policy import instant_policy_process
from gearshift.topology import SERVICE_NAMES

BASE_PORT = 23900  # below the ephemeral range (32768-60999): no client socket can hold it
OPEN_GATEWAY_PORT = BASE_PORT + 20
STEADY, FLOODER = new_key(), new_key()
ASK = {"model": "gearshift-instant", "messages": [{"role": "user", "content": "What is the capital of France?"}]}
FLOOD_WARM_UP_SECONDS = 1.0  # the flood under way before the first measured request
CONDITIONS = [(limits, flooded) for flooded in (False, True) for limits in (True, False)]


def condition_name(limits: bool, flooded: bool) -> str:
    return f"limits {'on' if limits else 'off'}, {'flood' if flooded else 'no flood'}"


class GatewayStack(Stack):
    """A Stack whose processes also get the gateway's settings in their environment."""

    def __init__(self, *args, gateway: dict, **kwargs):
        super().__init__(*args, **kwargs)
        self.gateway = {f"GEARSHIFT_GATEWAY__{name.upper()}": value if isinstance(value, str) else json.dumps(value)
                        for name, value in gateway.items()}

    def environment(self) -> dict[str, str]:
        return super().environment() | self.gateway


# The flood's process: it waits for a gateway URL, floods it until told to stop, sends back the
# statuses it got, and waits for the next.


def flood_process(orders, key: str, flooders: int, stop, started) -> None:
    while (url := orders.recv()) is not None:
        orders.send(asyncio.run(flood(url, key, flooders, stop, started)))


async def flood(url: str, key: str, flooders: int, stop, started) -> dict:
    statuses: Counter = Counter()
    latencies: dict[str, list[float]] = {}
    began = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=600,
                                 limits=httpx.Limits(max_connections=flooders)) as http:
        async def one_client() -> None:
            while not stop.is_set():
                sent = time.perf_counter()
                try:
                    status = str((await http.post("/chat/completions", json=ASK)).status_code)
                except httpx.TransportError as exc:
                    status = type(exc).__name__
                statuses[status] += 1
                latencies.setdefault(status, []).append(time.perf_counter() - sent)
                started.set()

        await asyncio.gather(*(one_client() for _ in range(flooders)))
    return {"statuses": dict(statuses), "seconds": round(time.perf_counter() - began, 2),
            "p50_ms": {status: round(statistics.median(values) * 1000, 1) for status, values in latencies.items()}}


class Flood:
    """The flood's process, driven from here: `with flood.on(url):` floods url while the block runs."""

    def __init__(self, flooders: int):
        spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of this one's state
        self.orders, theirs = spawn.Pipe()
        self.stop, self.started = spawn.Event(), spawn.Event()
        self.process = spawn.Process(target=flood_process, args=(theirs, FLOODER, flooders, self.stop, self.started), daemon=True)
        self.process.start()
        self.last: dict = {}

    @contextlib.asynccontextmanager
    async def on(self, url: str):
        self.stop.clear()
        self.started.clear()
        self.orders.send(url)
        if not await asyncio.to_thread(self.started.wait, 60):
            raise RuntimeError("the flood got no reply in 60 s")
        await asyncio.sleep(FLOOD_WARM_UP_SECONDS)
        try:
            yield
        finally:
            self.stop.set()
            self.last = await asyncio.to_thread(self.orders.recv)  # once its requests in flight are answered

    def close(self) -> None:
        self.orders.send(None)
        self.process.join(timeout=10)


def cpu_seconds(processes: dict[str, list[psutil.Process]]) -> dict[str, float]:
    """User + system CPU so far of each group of processes."""
    return {name: sum(sum(process.cpu_times()[:2]) for process in group) for name, group in processes.items()}


def quantiles(seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    return {"p50_ms": round(statistics.median(ordered) * 1000, 1), "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))] * 1000, 1)}


async def steady_requests(url: str, requests: int, seconds: float) -> list[float]:
    """The well-behaved key's completions, one at a time: each one's latency."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {STEADY}"}, timeout=600) as http:
        while len(latencies) < requests and time.perf_counter() < deadline:
            started = time.perf_counter()
            reply = await http.post("/chat/completions", json=ASK)
            if reply.status_code != 200:
                raise RuntimeError(f"the steady key got {reply.status_code}: {reply.text[:200]}")
            latencies.append(time.perf_counter() - started)
    return latencies


async def measure(args: argparse.Namespace, urls: dict[bool, str], flood: Flood, processes: dict[str, list[psutil.Process]]) -> dict:
    for url in urls.values():  # connections, caches and the store warmed before anything counts
        await steady_requests(url, 10, 30)
    rounds: dict[str, list[dict]] = {condition_name(*c): [] for c in CONDITIONS}
    for index in range(args.rounds):
        for limits, flooded in CONDITIONS[index % 4:] + CONDITIONS[:index % 4]:
            before, began = cpu_seconds(processes), time.perf_counter()
            async with flood.on(urls[limits]) if flooded else contextlib.nullcontext():
                latencies = await steady_requests(urls[limits], args.requests, args.condition_seconds)
            elapsed = time.perf_counter() - began
            used = {name: round(100 * (value - before[name]) / elapsed) for name, value in cpu_seconds(processes).items()}
            rounds[condition_name(limits, flooded)].append(quantiles(latencies) | {"n": len(latencies), "cpu_percent": used}
                                                           | ({"flood": flood.last} if flooded else {}))
    return {name: summary(figures) for name, figures in rounds.items()}


def summary(rounds: list[dict]) -> dict:
    """A condition's medians over its rounds, and each round's figures."""
    medians = {q: statistics.median(r[q] for r in rounds) for q in ("p50_ms", "p99_ms")}
    cpu = {name: statistics.median(r["cpu_percent"][name] for r in rounds) for name in rounds[0]["cpu_percent"]}
    flood = {}
    if "flood" in rounds[0]:
        statuses = Counter()
        for r in rounds:
            statuses.update(r["flood"]["statuses"])
        flood = {"flood_statuses": dict(statuses),
                 "flood_replies_per_second": round(sum(statuses.values()) / sum(r["flood"]["seconds"] for r in rounds)),
                 "flood_reply_p50_ms": {status: statistics.median(r["flood"]["p50_ms"][status] for r in rounds if status in r["flood"]["p50_ms"])
                                        for status in statuses}}
    return medians | {"p99_ms_range": [min(r["p99_ms"] for r in rounds), max(r["p99_ms"] for r in rounds)],
                      "requests": sum(r["n"] for r in rounds), "median_cpu_percent": cpu} | flood | {"rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="times each condition is taken, in turn with the others")
    parser.add_argument("--requests", type=int, default=100, help="the steady key's completions per condition and round, at most")
    parser.add_argument("--condition-seconds", type=float, default=15.0, help="the most one condition of one round measures")
    parser.add_argument("--flooders", type=int, default=64, help="concurrent clients of the flooding key")
    parser.add_argument("--rate", type=float, default=5.0, help="the flooding key's requests a second under the limits")
    parser.add_argument("--concurrent", type=int, default=4, help="the flooding key's requests in flight under the limits")
    args = parser.parse_args()
    flood = Flood(args.flooders)  # before this process runs any gRPC (the health checks): it forks nothing after
    with scratch_database("gearshift_admission_bench") as database_url, instant_policy_process() as policy_url, \
            tempfile.TemporaryDirectory(prefix="gearshift-admission-bench-") as data_dir, contextlib.ExitStack() as exits:
        exits.callback(flood.close)
        keys_file = Path(data_dir) / "api-keys.json"
        keys_file.write_text(json.dumps({"steady": key_hash(STEADY), "flooder": key_hash(FLOODER)}))
        settings = Settings(data_dir=data_dir, database_url=database_url, log_level="WARNING").with_policy(policy_url, "smollm2")
        limited = GatewayStack(settings, base_port=BASE_PORT, with_policy=False, gateway={
            "api_keys_file": str(keys_file),
            "key_policies": {"flooder": {"rate_per_second": args.rate, "burst": max(1, int(args.rate)), "max_concurrent": args.concurrent},
                             "steady": {"rate_per_second": 1000.0, "burst": 1000}}})  # one request at a time, as fast as they come back
        everything_but_the_gateway = {name: limited.address(name) for name in SERVICE_NAMES if name != "gateway"}
        unlimited = GatewayStack(settings, data_dir=str(Path(data_dir) / "open"), base_port=OPEN_GATEWAY_PORT, with_policy=False,
                                 elsewhere=everything_but_the_gateway,
                                 gateway={"api_keys_file": str(keys_file), "rate_per_second": "0", "max_concurrent_per_key": "0",
                                          "max_concurrency": "0"})
        for stack in (limited, unlimited):
            stack.start()  # both before any gRPC runs here (forking while gRPC's threads run can abort the child)
            exits.callback(stack.stop)
        for stack in (unlimited, limited):  # the open gateway stops first: it calls the other's services
            health = stack.wait_ready()
            if any(state != "SERVING" for _, state in health.values()):
                raise RuntimeError(f"the stack did not come up: {health}")
        urls = {limits: f"http://{stack.client_settings().gateway_addr}/v1" for limits, stack in ((True, limited), (False, unlimited))}
        processes = {"gateway with limits": [psutil.Process(limited.processes["gateway"].pid)],
                     "gateway without limits": [psutil.Process(unlimited.processes["gateway"].pid)],
                     "other services": [psutil.Process(p.pid) for name, p in limited.processes.items() if name != "gateway"],
                     "flood": [psutil.Process(flood.process.pid)], "steady client (this process)": [psutil.Process()]}
        figures = asyncio.run(measure(args, urls, flood, processes))
    print(json.dumps({"latency_of_the_steady_key": figures, "rounds": args.rounds, "requests_per_condition": args.requests,
                      "condition_seconds": args.condition_seconds, "flooders": args.flooders,
                      "flooder_limits": {"rate_per_second": args.rate, "burst": max(1, int(args.rate)), "max_concurrent": args.concurrent},
                      "policy": "ScriptedPolicy stand-in, instant (a stub)", "store": "Postgres", "cpus": os.cpu_count(),
                      "load_average_1min": round(os.getloadavg()[0], 2)}, indent=2))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
