"""The embedded stack: every service as its own process on localhost, one command to start
and stop them all (`gearshift up`). Services start in the table's order and stop in reverse,
each drained by SIGTERM; if `gearshift up` itself dies, even by SIGKILL, the kernel sends its
children SIGTERM (a parent-death signal), so nothing is left running."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gearshift.clients import channel
from gearshift.settings import Settings
from gearshift.topology import METRICS_PORT_OFFSET, SERVICE_NAMES, SERVICES

PR_SET_PDEATHSIG = 1  # prctl(2)


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGTERM when the parent (gearshift up) dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


async def check_health(settings: Settings, timeout: float = 2.0) -> dict[str, tuple[str, str]]:
    """Asks every service whether it serves: grpc.health.v1 for gRPC services, GET /ready for
    HTTP ones; returns name -> (address, state)."""

    async def grpc_state(address: str) -> str:
        async with channel(address, settings) as ch:
            try:
                reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                return f"DOWN ({exc.code().name})"
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    async def http_state(address: str) -> str:
        try:
            async with httpx.AsyncClient(timeout=timeout) as client:
                response = await client.get(f"http://{address}/ready")
        except httpx.TransportError:
            return "DOWN"
        return {200: "SERVING", 503: "NOT_SERVING"}.get(response.status_code, f"DOWN ({response.status_code})")

    checks = {"grpc": grpc_state, "http": http_state}

    async def one(spec) -> tuple[str, tuple[str, str]]:
        address = settings.address_of(spec.name)
        return spec.name, (address, await checks[spec.protocol](address))

    return dict(await asyncio.gather(*(one(spec) for spec in SERVICES)))


def policy_health(policy_url: str) -> str:
    """SERVING when the policy server's /health answers 200."""
    try:
        response = httpx.get(policy_url.removesuffix("/v1") + "/health", timeout=1.0)
    except httpx.TransportError:
        return "DOWN"
    return "SERVING" if response.status_code == 200 else f"DOWN ({response.status_code})"


class Stack:
    """Starts, watches and stops the service processes of the embedded default."""

    def __init__(self, settings: Settings, data_dir: str | None = None, base_port: int | None = None, with_policy: bool = True,
                 elsewhere: dict[str, str] | None = None):
        self.settings = settings
        self.data_dir = Path(data_dir).expanduser() if data_dir else settings.data_dir
        self.ports = {spec.name: (base_port + i if base_port else spec.port) for i, spec in enumerate(SERVICES)}
        # Services run elsewhere (name -> address, e.g. replicas behind one gRPC target): not started here.
        self.elsewhere = elsewhere or {}
        self.policy_port = base_port + len(SERVICES) if base_port else settings.policy_server.port
        self.with_policy = with_policy
        self.processes: dict[str, subprocess.Popen] = {}

    @property
    def policy_url(self) -> str:
        return f"http://{self.settings.host}:{self.policy_port}/v1" if self.with_policy else self.settings.policy_client.url

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["GEARSHIFT_DATA_DIR"] = str(self.data_dir)
        env["GEARSHIFT_LOG_LEVEL"] = self.settings.log_level
        env["GEARSHIFT_POLICY_CLIENT__URL"] = self.policy_url
        env["GEARSHIFT_POLICY_SERVER__PORT"] = str(self.policy_port)
        if self.settings.database_url:  # given in code (a benchmark's --postgres), not only in the environment
            env["GEARSHIFT_DATABASE_URL"] = self.settings.database_url
        for spec in SERVICES:
            env[f"GEARSHIFT_{spec.address_setting.upper()}"] = self.address(spec.name)
        return env

    def address(self, name: str) -> str:
        return self.elsewhere.get(name) or f"{self.settings.host}:{self.ports[name]}"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = self.environment()
        if self.with_policy:
            self.processes["policy"] = self._spawn(["serve-policy"], env)
        for name in SERVICE_NAMES:
            if name in self.elsewhere:
                continue
            port = self.ports[name]
            self.processes[name] = self._spawn(
                ["serve", name], dict(env, GEARSHIFT_PORT=str(port), GEARSHIFT_METRICS_PORT=str(port + METRICS_PORT_OFFSET))
            )

    @staticmethod
    def _spawn(command: list[str], env: dict[str, str]) -> subprocess.Popen:
        # Own session: Ctrl-C reaches only us, and we stop the children in order.
        return subprocess.Popen([sys.executable, "-m", "gearshift.cli", *command], env=env, start_new_session=True,
                                preexec_fn=_die_with_parent)

    def client_settings(self) -> Settings:
        """Settings whose addresses point at this stack's services."""
        addresses = {spec.address_setting: self.address(spec.name) for spec in SERVICES}
        return self.settings.with_policy(self.policy_url).model_copy(update=addresses)

    def wait_ready(self, timeout: float = 180.0) -> dict[str, tuple[str, str]]:
        """Waits until every service reports SERVING (and the policy server answers /health)."""
        settings = self.client_settings()
        deadline = time.monotonic() + timeout
        while True:
            dead = [n for n, p in self.processes.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"exited during start-up: {', '.join(dead)}")
            results = asyncio.run(check_health(settings, timeout=1.0))
            if self.with_policy:
                results["policy"] = (self.policy_url, policy_health(self.policy_url))
            if all(state == "SERVING" for _, state in results.values()) or time.monotonic() > deadline:
                return results
            time.sleep(0.3)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to every child in reverse start order (each drains); SIGKILL after the grace."""
        for name in reversed(self.processes):
            process = self.processes[name]
            if process and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def run_foreground(self) -> int:
        """Starts the stack, prints where each service listens, waits for Ctrl-C."""
        stopping = False

        def on_signal(signum, frame):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        self.start()
        try:
            results = self.wait_ready()
            for name, (address, state) in results.items():
                print(f"{name:<9} {address:<30} {state}", flush=True)
            if not all(state == "SERVING" for _, state in results.values()):
                print("gearshift up: not every service became ready", file=sys.stderr)
                return 1
            print(f"store: {self.settings.store_database_url() if self.settings.database_url else self.data_dir / 'store.db'}")
            print("gearshift is up; Ctrl-C stops it", flush=True)
            while not stopping:
                dead = [n for n, p in self.processes.items() if p.poll() is not None]
                if dead:
                    print(f"service(s) exited: {', '.join(dead)}; stopping", file=sys.stderr)
                    return 1
                time.sleep(0.3)
            return 0
        except RuntimeError as exc:
            print(f"gearshift up: {exc}", file=sys.stderr)
            return 1
        finally:
            self.stop()
            print("gearshift stopped", flush=True)
