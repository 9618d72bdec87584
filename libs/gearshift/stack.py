"""The embedded stack: every service as its own process on localhost, one command to start
and stop them all (`gearshift up`). Services start in the table's order; they stop callers
first (the loop, the gateway, the executor, ..., the store and the policy server last), each
drained by SIGTERM, so that no call in flight loses what it calls. If `gearshift up` itself dies,
even by SIGKILL, the kernel sends its children SIGTERM (a parent-death signal), so nothing is left
running.

While it serves, `gearshift up` writes where (STACK_FILE in its data directory, removed when it
stops); the other commands read it when no address is set (gearshift.cli.common), so that they
find a stack on any ports.

With the loop (`gearshift up --loop`, when Redis answers), a Celery worker and one beat start
after the services: the beat checks the training trigger, the worker runs the rounds it queues."""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gearshift import tls
from gearshift.clients import channel
from gearshift.settings import Settings
from gearshift.topology import BY_NAME, METRICS_PORT_OFFSET, POLICY, SERVICE_NAMES, SERVICES, ports

STACK_FILE = "stack.json"  # in the data directory: where a running `gearshift up` serves

PR_SET_PDEATHSIG = 1  # prctl(2)
STOP_GRACE_SECONDS = 10.0
# The worker's soft shutdown under `gearshift up`: Ctrl-C gives a running task this long, then
# puts it back on the queue (a training run goes on and the next `gearshift up` re-attaches).
LOOP_SOFT_SHUTDOWN_SECONDS = 10.0


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
            async with httpx.AsyncClient(timeout=timeout, verify=tls.client_context(settings.tls) or True) as client:
                response = await client.get(f"{tls.scheme(settings.tls)}://{address}/ready", extensions=sni(settings))
        except httpx.TransportError:
            return "DOWN"
        return {200: "SERVING", 503: "NOT_SERVING"}.get(response.status_code, f"DOWN ({response.status_code})")

    checks = {"grpc": grpc_state, "http": http_state}

    async def one(spec) -> tuple[str, tuple[str, str]]:
        address = settings.address_of(spec.name)
        return spec.name, (address, await checks[spec.protocol](address))

    return dict(await asyncio.gather(*(one(spec) for spec in SERVICES)))


def redis_answers(url: str, timeout: float = 1.0) -> bool:
    """Whether a Redis server answers PING at the URL."""
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout).ping())
    except (redis.RedisError, OSError, ValueError):
        return False


def sni(settings: Settings) -> dict:
    """httpx's request extension checking the certificate for tls.server_name, not the host dialed."""
    return {"sni_hostname": settings.tls.server_name} if settings.tls.enabled and settings.tls.server_name else {}


def policy_health(policy_url: str, settings: Settings) -> str:
    """SERVING when the policy server's /health answers 200."""
    try:
        with httpx.Client(timeout=1.0, verify=tls.client_context(settings.tls) or True) as client:
            response = client.get(policy_url.removesuffix("/v1") + "/health", extensions=sni(settings))
    except httpx.TransportError:
        return "DOWN"
    return "SERVING" if response.status_code == 200 else f"DOWN ({response.status_code})"


class Stack:
    """Starts, watches and stops the service processes of the embedded default."""

    def __init__(self, settings: Settings, data_dir: str | None = None, base_port: int | None = None, with_policy: bool = True,
                 elsewhere: dict[str, str] | None = None, with_loop: bool = False):
        self.settings = settings
        self.data_dir = Path(data_dir).expanduser() if data_dir else settings.data_dir
        self.ports = ports(base_port, settings.policy_server.port)
        # Services run elsewhere (name -> address, e.g. replicas behind one gRPC target): not started here.
        self.elsewhere = elsewhere or {}
        self.policy_port = self.ports[POLICY]
        self.with_policy = with_policy
        self.with_loop = with_loop  # the Celery worker and beat, when Redis answers
        self.loop = ""  # what start() decided about them, in words
        self.processes: dict[str, subprocess.Popen] = {}

    @property
    def policy_url(self) -> str:
        return f"{tls.scheme(self.settings.tls)}://{self.settings.host}:{self.policy_port}/v1" if self.with_policy else self.settings.policy_client.url

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
        self._start_loop(env)

    def _start_loop(self, env: dict[str, str]) -> None:
        """A Celery worker on both queues and exactly one beat, when asked for and Redis answers
        (without Redis the stack runs as it would without them)."""
        url, orchestration = self.settings.redis_url, self.settings.orchestration
        if not self.with_loop:
            self.loop = "off (--loop starts a Celery worker and beat)"
            return
        if not redis_answers(url):
            self.loop = f"off: Redis at {url} does not answer"
            return
        from gearshift.orchestration.app import APP, QUEUES

        soft = min(orchestration.soft_shutdown_seconds, LOOP_SOFT_SHUTDOWN_SECONDS)
        env = dict(env, GEARSHIFT_REDIS_URL=url, GEARSHIFT_ORCHESTRATION__SOFT_SHUTDOWN_SECONDS=str(soft))
        celery = ["-m", "celery", "-A", APP, "--quiet"]
        self.processes["worker"] = self._spawn([*celery, "worker", "--queues", ",".join(QUEUES), "--concurrency", "1",
                                                "--hostname", f"up-{os.getpid()}@%h", "--loglevel", self.settings.log_level], env)
        self.processes["beat"] = self._spawn([*celery, "beat", "--schedule", str(self.data_dir / "celerybeat-schedule"),
                                              "--loglevel", self.settings.log_level], env)
        metrics = f"worker metrics on :{orchestration.metrics_port}" if orchestration.metrics_port else "worker metrics off"
        self.loop = f"worker + beat on {url} (trigger checked every {orchestration.trigger_interval_seconds:g} s; {metrics})"

    @staticmethod
    def _spawn(command: list[str], env: dict[str, str]) -> subprocess.Popen:
        """`python -m gearshift.cli COMMAND`, or `python COMMAND` when it starts with -m."""
        # Own session: Ctrl-C reaches only us, and we stop the children in order.
        arguments = command if command[0] == "-m" else ["-m", "gearshift.cli", *command]
        return subprocess.Popen([sys.executable, *arguments], env=env, start_new_session=True, preexec_fn=_die_with_parent)

    def client_settings(self) -> Settings:
        """Settings whose addresses point at this stack's services."""
        addresses = {spec.address_setting: self.address(spec.name) for spec in SERVICES}
        return self.settings.with_policy(self.policy_url).model_copy(update=addresses)

    def wait_ready(self, timeout: float = 180.0) -> dict[str, tuple[str, str]]:
        """Waits until every service reports SERVING (and the policy server answers /health)."""
        settings = self.client_settings()
        deadline = time.monotonic() + timeout
        while True:
            dead = [f"{n} (exit status {p.returncode})" for n, p in self.processes.items() if p.poll() is not None]
            if dead:  # a negative status is the signal that ended it
                raise RuntimeError(f"exited during start-up: {', '.join(dead)}")
            results = asyncio.run(check_health(settings, timeout=1.0))
            if self.with_policy:
                results["policy"] = (self.policy_url, policy_health(self.policy_url, self.settings))
            if all(state == "SERVING" for _, state in results.values()) or time.monotonic() > deadline:
                return results
            time.sleep(0.3)

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """Stops the children callers first (stop_tiers): SIGTERM to a tier (each drains), SIGKILL
        to what is left of it after the grace (and the worker's soft shutdown, when it runs),
        then the next tier."""
        for tier in stop_tiers(list(self.processes)):
            running = [self.processes[name] for name in tier if self.processes[name].poll() is None]
            for process in running:
                process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace + (LOOP_SOFT_SHUTDOWN_SECONDS if "worker" in tier else 0)
            for process in running:
                try:
                    process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

    @property
    def stack_file(self) -> Path:
        return self.data_dir / STACK_FILE

    def write_stack_file(self) -> None:
        """Says where this stack serves, for the commands that look for it (read_stack_file);
        refuses when a live `gearshift up` already serves from this data directory."""
        running = read_stack_file(self.data_dir)
        if running and running["pid"] != os.getpid():
            raise RuntimeError(f"another gearshift up (pid {running['pid']}) serves from {self.data_dir}; "
                               "stop it, or give this one another --data-dir")
        record = {"pid": os.getpid(), "addresses": {spec.name: self.address(spec.name) for spec in SERVICES},
                  "policy_url": self.policy_url}
        partial = self.stack_file.with_name(STACK_FILE + ".partial")
        partial.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(partial, self.stack_file)  # a reader never sees half a file

    def remove_stack_file(self) -> None:
        """Removes the stack file if it is this process's."""
        running = read_stack_file(self.data_dir)
        if running and running["pid"] == os.getpid():
            self.stack_file.unlink(missing_ok=True)

    def run_foreground(self) -> int:
        """Starts the stack, prints where each service listens, waits for Ctrl-C."""
        stopping = False

        def on_signal(signum, frame):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.write_stack_file()  # before start-up, so that `gearshift status` shows it coming up
            self.start()
            results = self.wait_ready()
            for name, (address, state) in results.items():
                print(f"{name:<9} {address:<30} {state}", flush=True)
            if not all(state == "SERVING" for _, state in results.values()):
                print("gearshift up: not every service became ready", file=sys.stderr)
                return 1
            print(f"{'loop':<9} {self.loop}", flush=True)
            print(f"store: {self.settings.store_database_url() if self.settings.database_url else self.data_dir / 'store.db'}")
            print(f"addresses: {self.stack_file} (commands run with GEARSHIFT_DATA_DIR={self.data_dir} find the stack by it)")
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
            self.remove_stack_file()
            print("gearshift stopped", flush=True)


def stop_tiers(names: list[str]) -> list[list[str]]:
    """The processes in stopping order, tier by tier: each tier holds what no process of a later
    tier calls (the topology's `calls`; the loop's worker and beat call everything), so every
    caller stops before what it calls and the members of a tier stop together."""
    def calls(name: str) -> set[str]:
        if name in BY_NAME:
            return set(BY_NAME[name].calls)
        return set() if name == POLICY else {*BY_NAME, POLICY}  # the worker and beat: every service

    tiers, left = [], list(names)
    while left:
        tier = [name for name in left if not any(name in calls(caller) for caller in left if caller != name)]
        if not tier:  # a cycle in the table: stop what is left together rather than never
            tier = left
        tiers.append(tier)
        left = [name for name in left if name not in tier]
    return tiers


def read_stack_file(data_dir: Path) -> dict | None:
    """What a live `gearshift up` serving from data_dir wrote ({"pid", "addresses": name ->
    address, "policy_url"}); None when there is none, or when its process is gone (a SIGKILLed up
    leaves the file behind)."""
    try:
        record = json.loads((Path(data_dir) / STACK_FILE).read_text())
        os.kill(int(record["pid"]), 0)  # signal 0: only whether the process exists
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record
