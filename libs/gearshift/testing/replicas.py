"""Replicas of one service on one machine, as a cluster runs them: each a process of its own on
its own loopback address (127.0.0.2, 127.0.0.3, ...), all on one port, reached through one
gRPC target naming every address (`ipv4:127.0.0.2:P,127.0.0.3:P`), which is what a headless
Service's DNS name resolves to. Slots are fixed up front, so a replica started later is already
in the target, as a new pod appears in DNS. Used by the scale-out tests and benchmarks."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gearshift.topology import METRICS_PORT_OFFSET

FIRST_HOST = 2  # 127.0.0.1 is the rest of the stack's
START_TIMEOUT_SECONDS = 60.0


class Replicas:
    """Up to `slots` replicas of service `name` on `port`; start, kill and stop them by index."""

    def __init__(self, name: str, port: int, slots: int, env: dict[str, str], log_dir: str | None = None,
                 data_root: str | None = None):
        self.name = name
        self.port = port
        self.hosts = [f"127.0.0.{FIRST_HOST + i}" for i in range(slots)]
        self.env = env
        self.log_dir = log_dir
        self.data_root = data_root  # when given, each replica's data directory is its own under it, as each pod has its volume
        self.processes: dict[int, subprocess.Popen] = {}

    @property
    def target(self) -> str:
        return "ipv4:" + ",".join(f"{host}:{self.port}" for host in self.hosts)

    def address(self, index: int) -> str:
        return f"{self.hosts[index]}:{self.port}"

    def start(self, index: int, wait: bool = True) -> None:
        host = self.hosts[index]
        env = dict(self.env, GEARSHIFT_HOST=host, GEARSHIFT_PORT=str(self.port),
                   GEARSHIFT_METRICS_PORT=str(self.port + METRICS_PORT_OFFSET))
        if self.data_root:
            env["GEARSHIFT_DATA_DIR"] = os.path.join(self.data_root, f"{self.name}-{index}")
        log = open(os.path.join(self.log_dir, f"{self.name}-{index}.log"), "ab") if self.log_dir else subprocess.DEVNULL
        self.processes[index] = subprocess.Popen([sys.executable, "-m", "gearshift.cli", "serve", self.name], env=env,
                                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        if wait:
            self.wait_serving(index)

    def wait_serving(self, index: int, timeout: float = START_TIMEOUT_SECONDS) -> None:
        wait_serving(self.address(index), self.processes[index], f"{self.name} replica {index}", timeout)

    def start_all(self, count: int) -> None:
        for index in range(count):
            self.start(index, wait=False)
        for index in range(count):
            self.wait_serving(index)

    def kill(self, index: int) -> None:
        """SIGKILL, as an OOM kill or a lost node ends a pod: no drain."""
        process = self.processes.pop(index)
        process.kill()
        process.wait()

    def terminate(self, index: int, timeout: float = 120.0) -> int:
        """SIGTERM, as Kubernetes stops a pod; waits for the drain to end. Returns the exit code."""
        process = self.processes.pop(index)
        process.send_signal(signal.SIGTERM)
        return process.wait(timeout=timeout)

    def stop_all(self) -> None:
        for index in list(self.processes):
            process = self.processes.pop(index)
            process.kill()
            process.wait()

    def calls_served(self, index: int, method: str) -> int:
        """Calls of method (e.g. "Score") that replica index answered, read from its /metrics."""
        text = httpx.get(f"http://{self.hosts[index]}:{self.port + METRICS_PORT_OFFSET}/metrics", timeout=5).text
        pattern = re.compile(rf'^grpc_server_handled_total{{[^}}]*method="{method}"[^}}]*}} (\S+)$', re.M)
        return int(sum(float(value) for value in pattern.findall(text)))

    def __enter__(self) -> Replicas:
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()


def wait_serving(address: str, process: subprocess.Popen, what: str, timeout: float = START_TIMEOUT_SECONDS) -> None:
    """Returns once the gRPC service at address says SERVING; RuntimeError when its process exits
    first or timeout passes."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{what} exited during start-up")
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not serve within {timeout:.0f} s")
            time.sleep(0.1)
