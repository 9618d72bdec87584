"""`gearshift up` as a user runs it: every service in its own process, `gearshift status`
reporting them, Prometheus metrics on their own ports, Ctrl-C stopping everything (health
watchers told NOT_SERVING, no traceback printed), and a killed `up` taking its services with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import httpx
import pytest
from gearshift.testing.certs import issue
from gearshift.topology import SERVICE_NAMES, SERVICES, ports
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.workers import FIXED_PORTS

BASE_PORT = 26500  # one gRPC port per service from here, metrics on port + 1000: below the ephemeral range (32768-60999), where a client socket of another test cannot take them

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(FIXED_PORTS)]


def gearshift(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gearshift.cli", *args], env=env, capture_output=True, text=True, timeout=60)


def start_up(data_dir, env) -> tuple[subprocess.Popen, str]:
    """`gearshift up` without a policy server, and what it printed until it said it is up."""
    up = subprocess.Popen(
        [sys.executable, "-m", "gearshift.cli", "up", "--no-policy", "--data-dir", str(data_dir), "--base-port", str(BASE_PORT)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines = []
    deadline = time.monotonic() + 90
    while not any("gearshift is up" in line for line in lines):
        assert up.poll() is None and time.monotonic() < deadline, "".join(lines)
        lines.append(up.stdout.readline())
    return up, "".join(lines)


def children_of(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(child) for child in found]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or going as we read
        return False


ENV = dict(os.environ, GEARSHIFT_LOG_LEVEL="WARNING")
PORTS = ports(BASE_PORT)  # the default layout's order from BASE_PORT
ADDRESSES = {f"GEARSHIFT_{spec.address_setting.upper()}": f"127.0.0.1:{PORTS[spec.name]}" for spec in SERVICES}
GRPC_ADDRESSES = {spec.name: f"127.0.0.1:{PORTS[spec.name]}" for spec in SERVICES if spec.protocol == "grpc"}


def watch_through_the_drain(address: str, seen: list[list]) -> None:
    """Watches a service's health to the end of the stream, then at once again, as a channel's
    health checking does: the second watch arrives while the service drains. Each watch's
    statuses (and its error code, if it ended in one) go to `seen`."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for _ in range(2):
            statuses: list = []
            seen.append(statuses)
            try:
                for reply in stub.Watch(health_pb2.HealthCheckRequest(), timeout=60):
                    statuses.append(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
            except grpc.RpcError as error:
                statuses.append(error.code().name)


def test_up_status_metrics_and_ctrl_c(tmp_path):
    up, listing = start_up(tmp_path, ENV)
    try:
        for name in SERVICE_NAMES:
            assert f"{name:<9} 127.0.0.1:{PORTS[name]} " in listing
        assert (tmp_path / "store.db").exists()

        status = gearshift("status", env=ENV | ADDRESSES)
        assert len(serving(status)) == len(SERVICES)  # the policy server was not started: reported down
        assert status.returncode == 1 and "policy" in status.stdout

        metrics = httpx.get(f"http://127.0.0.1:{PORTS['store'] + 1000}/metrics", timeout=5).text
        assert 'grpc_server_handled_total{code="OK",method="Check",service="grpc.health.v1.Health"}' in metrics

        seen = {name: [] for name in GRPC_ADDRESSES}
        watchers = [threading.Thread(target=watch_through_the_drain, args=(address, seen[name]), daemon=True)
                    for name, address in GRPC_ADDRESSES.items()]
        for watcher in watchers:
            watcher.start()
        deadline = time.monotonic() + 10
        while not all(watches and watches[0] for watches in seen.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=60)
    assert up.returncode == 0 and "gearshift stopped" in out
    assert "Traceback" not in out, out
    for watcher in watchers:
        watcher.join(timeout=10)
    assert seen == {name: [["SERVING", "NOT_SERVING"], ["NOT_SERVING"]] for name in GRPC_ADDRESSES}
    after = gearshift("status", env=ENV | ADDRESSES)
    assert after.returncode == 1 and "SERVING" not in after.stdout


def serving(status: subprocess.CompletedProcess) -> list[str]:
    return [line for line in status.stdout.splitlines() if line.split()[-1:] == ["SERVING"]]


def test_up_over_mutual_tls_serves_clients_with_the_certificate_and_refuses_plaintext(tmp_path):
    tls_env = ENV | issue(tmp_path / "tls").env(client_auth=True)
    up, _ = start_up(tmp_path / "data", tls_env)  # up waits for every service to answer its health check over TLS
    try:
        assert len(serving(gearshift("status", env=tls_env | ADDRESSES))) == len(SERVICES)
        assert serving(gearshift("status", env=ENV | ADDRESSES)) == []
    finally:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=60)
    assert up.returncode == 0 and "Traceback" not in out, out


def test_a_killed_up_takes_its_services_and_their_workers_with_it(tmp_path):
    up, _ = start_up(tmp_path, ENV)
    services = children_of(up.pid)
    descendants = services + [grandchild for pid in services for grandchild in children_of(pid)]
    assert len(services) == len(SERVICES) and len(descendants) > len(services)  # the sandbox's zygote and workers
    up.kill()  # SIGKILL: no handler of `up` runs
    up.wait(timeout=10)
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in descendants) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [pid for pid in descendants if alive(pid)] == []
    assert gearshift("status", env=ENV | ADDRESSES).returncode == 1
