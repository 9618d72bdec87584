"""The faults, in the order the suite injects them, and how one runs under load: load for a
while, inject, stay broken for a while, heal (a restart, a restore) and wait until the platform
uses what came back, more load, then every request's outcome."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tests.faults.load import GatewayLoad, Outcome
from tests.faults.cluster import FaultPlatform

BACK_SECONDS = 60.0  # how long a healed dependency may take to be used again
KILLED = 0  # the replica killed: the first of the two


@dataclass(frozen=True)
class Form:
    """How long each phase lasts, and the settings the services run with."""

    name: str
    clients: int  # concurrent clients of the gateway
    rate: float  # requests a second, every client together
    seconds_per_call: float  # the stand-in policy's time per call
    before: float  # seconds of load before the fault
    down: float  # seconds a killed process stays down
    outage: float  # seconds Postgres stays cut
    after: float  # seconds of load once the platform uses what came back
    timeout: float  # a client's timeout of one request
    environment: dict[str, str]


# make test's: seconds of load around each fault, the executor's store retries cut to 1 s so that
# a 3 s database outage already goes through the spool.
SHORT = Form("short", clients=8, rate=12.0, seconds_per_call=0.15, before=1.0, down=1.0, outage=3.0, after=1.0, timeout=60.0,
             environment={"GEARSHIFT_EXECUTOR__STORE_RETRY_SECONDS": "1", "GEARSHIFT_EXECUTOR__SPOOL_REPLAY_MAX_BACKOFF_SECONDS": "0.5"})
# make faults': the services' own settings, longer load and outages, the 60 s database outage (longer
# than executor.store_retry_seconds: the spool takes the episodes that end in it).
LONG = Form("long", clients=16, rate=15.0, seconds_per_call=0.25, before=10.0, down=15.0, outage=60.0, after=10.0, timeout=300.0, environment={})


@dataclass
class Healed:
    note: str
    back: bool  # the platform used it again within BACK_SECONDS


@dataclass(frozen=True)
class Fault:
    name: str
    inject: Callable[[FaultPlatform], Awaitable[str]]  # returns a note for the table
    heal: Callable[[FaultPlatform, GatewayLoad], Awaitable[Healed]]
    outage: bool = False  # down for Form.outage rather than Form.down


@dataclass
class FaultRun:
    fault: str
    down_seconds: float
    outcomes: list[Outcome]
    feedback: list[Outcome]
    throttled: int  # 429s from the gateway's admission control, each waited out and sent again
    notes: list[str]
    back: bool


async def until(predicate: Callable[[], bool], seconds: float = BACK_SECONDS) -> float | None:
    """Seconds until predicate (run in a thread: it may make an HTTP call) holds; None if it did not in time."""
    started = time.monotonic()
    while not await asyncio.to_thread(predicate):
        if time.monotonic() - started > seconds:
            return None
        await asyncio.sleep(0.2)
    return time.monotonic() - started


def replica_killed(service: str, method: str) -> Fault:
    """kill -9 of one replica of service; started again, it must answer `method` calls again."""

    async def inject(platform: FaultPlatform) -> str:
        await asyncio.to_thread(platform.replicas[service].kill, KILLED)
        return ""

    async def heal(platform: FaultPlatform, load: GatewayLoad) -> Healed:
        replicas = platform.replicas[service]
        await asyncio.to_thread(replicas.start, KILLED)  # returns once it serves
        took = await until(lambda: replicas.calls_served(KILLED, method) > 0)
        return Healed(f"restarted replica answered {method} {took:.1f} s after it served" if took is not None
                      else f"restarted replica answered no {method} in {BACK_SECONDS:.0f} s", took is not None)

    return Fault(f"kill -9 {service} replica", inject, heal)


async def cut_postgres(platform: FaultPlatform) -> str:
    platform.postgres.cut()
    return ""


async def restore_postgres(platform: FaultPlatform, load: GatewayLoad) -> Healed:
    depth = await asyncio.to_thread(platform.spool_depth)
    platform.postgres.restore()
    took = await until(lambda: platform.spool_depth() == 0)
    return Healed(f"spool held {depth:.0f} at the restore, empty {took:.1f} s after" if took is not None
                  else f"spool held {depth:.0f} at the restore, not empty after {BACK_SECONDS:.0f} s", took is not None)


async def stop_redis(platform: FaultPlatform) -> str:
    clients = await asyncio.to_thread(platform.redis.platform_clients)
    await asyncio.to_thread(platform.redis.stop)
    return f"{clients} platform connections to Redis (no service uses it on this path)" if not clients else f"{clients} platform connections to Redis"


async def start_redis(platform: FaultPlatform, load: GatewayLoad) -> Healed:
    await asyncio.to_thread(platform.redis.start)
    return Healed("", True)


async def kill_policy(platform: FaultPlatform) -> str:
    await asyncio.to_thread(platform.policy.kill)
    return ""


async def start_policy(platform: FaultPlatform, load: GatewayLoad) -> Healed:
    await asyncio.to_thread(platform.policy.start)
    started = time.monotonic()
    took = await until(lambda: load.acknowledged_since(started) > 0)
    return Healed(f"answers again {took:.1f} s after its start" if took is not None else "no answer since its start", took is not None)


# Every gRPC service's replica (with a method the load reaches it by), then the dependencies.
FAULTS = (
    replica_killed("router", "Route"),
    replica_killed("planner", "Regulate"),
    replica_killed("executor", "Solve"),
    replica_killed("sandbox", "Execute"),
    replica_killed("reward", "Score"),  # graded feedback
    replica_killed("store", "Put"),
    Fault("Postgres stopped and started", cut_postgres, restore_postgres, outage=True),
    Fault("Redis restarted", stop_redis, start_redis),
    Fault("policy server killed and restarted", kill_policy, start_policy),
)


async def run(platform: FaultPlatform, fault: Fault, form: Form) -> FaultRun:
    """One fault under load; returns when every request sent has its outcome."""
    load = GatewayLoad(platform.gateway_url, form.clients, form.rate, fault.name, form.timeout)
    await asyncio.sleep(form.before)
    notes = [await fault.inject(platform)]
    broken_at = time.monotonic()
    await asyncio.sleep(form.outage if fault.outage else form.down)
    healed = await fault.heal(platform, load)
    down = time.monotonic() - broken_at
    await asyncio.sleep(form.after)
    await load.stop()
    return FaultRun(fault.name, down, load.outcomes, load.feedback, load.throttled, [n for n in (*notes, healed.note) if n], healed.back)
