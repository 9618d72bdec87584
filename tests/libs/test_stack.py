"""`gearshift up` as a user runs it: every service in its own process, `gearshift status`
reporting them, Prometheus metrics on their own ports, and Ctrl-C stopping everything."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from gearshift.settings import SERVICES

BASE_PORT = 56500  # six gRPC ports from here; metrics on port + 1000

pytestmark = pytest.mark.slow


def gearshift(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gearshift.cli", *args], env=env, capture_output=True, text=True, timeout=60)


def test_up_status_metrics_and_ctrl_c(tmp_path):
    env = dict(os.environ, GEARSHIFT_LOG_LEVEL="WARNING")
    addresses = {f"GEARSHIFT_{name.upper()}_ADDR": f"127.0.0.1:{BASE_PORT + i}" for i, name in enumerate(SERVICES)}
    up = subprocess.Popen(
        [sys.executable, "-m", "gearshift.cli", "up", "--no-policy", "--data-dir", str(tmp_path), "--base-port", str(BASE_PORT)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        lines = []
        deadline = time.monotonic() + 90
        while not any("gearshift is up" in line for line in lines):
            assert up.poll() is None and time.monotonic() < deadline, "".join(lines)
            lines.append(up.stdout.readline())
        listing = "".join(lines)
        for i, name in enumerate(SERVICES):
            assert f"127.0.0.1:{BASE_PORT + i}" in listing and name in listing
        assert (tmp_path / "store.db").exists()

        status = gearshift("status", env=env | addresses)
        serving = [line for line in status.stdout.splitlines() if line.split()[-1:] == ["SERVING"]]
        assert len(serving) == len(SERVICES)  # the policy server was not started: reported down
        assert status.returncode == 1 and "policy" in status.stdout

        metrics = httpx.get(f"http://127.0.0.1:{BASE_PORT + 1000 + SERVICES.index('store')}/metrics", timeout=5).text
        assert 'grpc_server_handled_total{code="OK",method="Check",service="grpc.health.v1.Health"}' in metrics
    finally:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=60)
    assert up.returncode == 0 and "gearshift stopped" in out
    after = gearshift("status", env=env | addresses)
    assert after.returncode == 1 and "SERVING" not in after.stdout
