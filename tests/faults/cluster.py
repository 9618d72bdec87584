"""The platform the fault suite breaks, as a cluster runs it on one machine: two replicas of
every gRPC service on 127.0.0.2 and 127.0.0.3 behind one target each (gearshift.testing.replicas,
each replica with a data directory of its own, as a pod has its volume), the gateway in front of
them, the store's Postgres reached through a TCP proxy that can cut it (tests/tcp_proxy.py), a
Redis of its own and a stand-in policy (tests/faults/policy_stub.py: the load costs the
platform's work, not a model's) on ports where a killed one can be started again."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis
from gearshift.settings import Settings
from gearshift.stack import Stack
from gearshift.testing.ports import free_port
from gearshift.testing.postgres import scratch_database
from gearshift.testing.replicas import Replicas
from gearshift.topology import GRPC_SERVICE_NAMES, METRICS_PORT_OFFSET
from sqlalchemy.engine import make_url

from tests.tcp_proxy import TcpProxy, tcp_proxy

REPLICAS = 2
BASE_PORT = 25100  # the stack's ports (the gateway's among them) from here: below the ephemeral range (tests/workers.py)
REPLICA_PORTS = {name: 25150 + i for i, name in enumerate(GRPC_SERVICE_NAMES)}  # metrics on port + 1000
START_SECONDS = 120.0
ROOT = Path(__file__).parents[2]  # where `python -m tests.faults...` runs


class PolicyStub:
    """tests/faults/policy_stub.py in a process of its own on a fixed port: killed, it is started
    again where every client already looks for it."""

    def __init__(self, port: int, seconds_per_call: float):
        self.port = port
        self.seconds_per_call = seconds_per_call
        self.url = f"http://127.0.0.1:{port}/v1"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "tests.faults.policy_stub", str(self.port), str(self.seconds_per_call)],
                                        stdout=subprocess.PIPE, text=True, cwd=ROOT)
        if self.process.stdout.readline().strip() != self.url:  # printed once it listens
            raise RuntimeError(f"the stand-in policy did not start on port {self.port}")

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


class RedisServer:
    """A redis-server of the suite's own on a free port, without persistence: a restart loses
    its data, as a Redis pod without a volume does."""

    def __init__(self, port: int, log: Path):
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.log = log
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                                             "--appendonly", "no"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while not self._answers():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"redis-server did not answer on port {self.port} (log: {self.log})")
            time.sleep(0.05)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)

    def platform_clients(self) -> int:
        """Connections open to it besides the one asking."""
        with redis.Redis.from_url(self.url, socket_timeout=2) as client:
            return len(client.client_list()) - 1

    def _answers(self) -> bool:
        try:
            with redis.Redis.from_url(self.url, socket_connect_timeout=0.5, socket_timeout=0.5) as client:
                return bool(client.ping())
        except (redis.RedisError, OSError):
            return False


class SuiteStack(Stack):
    """The stack with the suite's Redis and settings in every process's environment."""

    def __init__(self, *args, extra: dict[str, str], **kwargs):
        super().__init__(*args, **kwargs)
        self.extra = extra

    def environment(self) -> dict[str, str]:
        return dict(super().environment(), GEARSHIFT_REDIS_URL=self.settings.redis_url, **self.extra)


@dataclass
class FaultPlatform:
    """What the faults act on, and where the load and the checks reach it."""

    replicas: dict[str, Replicas]
    stack: Stack  # the gateway; every gRPC service runs as replicas
    postgres: TcpProxy
    redis: RedisServer
    policy: PolicyStub

    @property
    def settings(self) -> Settings:
        """Client settings whose addresses are the replicas' targets and the gateway."""
        return self.stack.client_settings()

    @property
    def gateway_url(self) -> str:
        return f"http://{self.settings.gateway_addr}/v1"

    def spool_depth(self) -> float:
        """Trajectories waiting in the executors' spools, over every running replica."""
        executors = self.replicas["executor"]
        return sum(metric(executors.hosts[i], executors.port, "gearshift_executor_spool_depth") for i in executors.processes)


def metric(host: str, port: int, name: str) -> float:
    """The sum of a metric's samples on a gRPC service's /metrics (port + 1000)."""
    text = httpx.get(f"http://{host}:{port + METRICS_PORT_OFFSET}/metrics", timeout=5).text
    return sum(float(value) for value in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


@contextlib.asynccontextmanager
async def fault_platform(tmp_path: Path, environment: dict[str, str], seconds_per_call: float) -> AsyncIterator[FaultPlatform]:
    """Starts it all, with `environment` (GEARSHIFT_* settings) in every service's and the policy
    taking seconds_per_call."""
    logs = tmp_path / "logs"
    logs.mkdir()
    with contextlib.ExitStack() as exits:
        postgres_url = make_url(exits.enter_context(scratch_database("gearshift_faults")))
        async with tcp_proxy(postgres_url.host, postgres_url.port) as proxy:
            redis_server = RedisServer(free_port(), logs / "redis.log")
            redis_server.start()
            exits.callback(redis_server.stop)
            policy = PolicyStub(free_port(), seconds_per_call)
            policy.start()
            exits.callback(lambda: policy.process.poll() is None and policy.kill())
            proxied = postgres_url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
            settings = Settings(data_dir=tmp_path / "data", database_url=proxied, redis_url=redis_server.url,
                                log_level="WARNING").with_policy(policy.url)
            replicas = {name: Replicas(name, port, REPLICAS, env={}, log_dir=str(logs), data_root=str(tmp_path / "volumes"))
                        for name, port in REPLICA_PORTS.items()}
            stack = SuiteStack(settings, data_dir=str(tmp_path / "data"), base_port=BASE_PORT, with_policy=False,
                               elsewhere={name: group.target for name, group in replicas.items()}, extra=environment)
            env = stack.environment()
            try:
                for group in replicas.values():
                    group.env = env
                    for index in range(REPLICAS):
                        group.start(index, wait=False)
                for group in replicas.values():
                    for index in range(REPLICAS):
                        await asyncio.to_thread(group.wait_serving, index, START_SECONDS)
                stack.start()
                states = await asyncio.to_thread(stack.wait_ready, START_SECONDS)
                assert all(state == "SERVING" for _, state in states.values()), states
                yield FaultPlatform(replicas, stack, proxy, redis_server, policy)
            finally:
                stack.stop()
                for group in replicas.values():
                    group.stop_all()
