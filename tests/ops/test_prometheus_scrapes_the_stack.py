"""A real Prometheus (Debian's, scripts/install-prometheus.sh) scrapes a running stack, every
service a process of its own with its metrics port, and the Celery worker's, as a cluster's
ServiceMonitors would: after episodes of each mode through the gateway, every query of every
dashboard the chart ships returns at least one series. A panel that reads a metric the platform
does not produce fails here. The policy is a stand-in that answers at once (named as such: the
platform's metrics are what is checked, not the model)."""

from __future__ import annotations

import subprocess
import time

import httpx
import pytest
import redis
import yaml
from gearshift.settings import Settings
from gearshift.stack import Stack
from gearshift.testing.scripted_policy import instant_policy_process
from gearshift.topology import METRICS_PORT_OFFSET, SERVICE_NAMES

from tests import workers
from tests.charts.monitoring import panel_queries, tool

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(workers.FIXED_PORTS)]

BASE_PORT = 23700  # the stack's ports from here, metrics on port + 1000: below the ephemeral range
WORKER_METRICS_PORT = BASE_PORT + 90
PROMETHEUS_PORT = BASE_PORT + 95
REDIS_URL = workers.redis_url()
MODELS = ("gearshift-instant", "gearshift-reasoning", "gearshift-agentic", "gearshift")
EPISODES_PER_MODEL = 2
SCRAPE_SECONDS = 1


def scrape_config(stack: Stack) -> dict:
    """One job per service (its metrics port) and one for the worker, named as the chart's
    ServiceMonitors name them (<release>-gearshift-<component>), so the rules' job matchers hold."""
    jobs = [{"job_name": f"gearshift-{name}", "static_configs": [{"targets": [f"127.0.0.1:{stack.ports[name] + METRICS_PORT_OFFSET}"]}]}
            for name in SERVICE_NAMES]
    jobs.append({"job_name": "gearshift-worker", "static_configs": [{"targets": [f"127.0.0.1:{WORKER_METRICS_PORT}"]}]})
    return {"global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s"}, "scrape_configs": jobs}


def query(expr: str) -> list[dict]:
    reply = httpx.get(f"http://127.0.0.1:{PROMETHEUS_PORT}/api/v1/query", params={"query": expr}, timeout=10)
    body = reply.json()
    assert reply.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
    return body["data"]["result"]


def until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
    return found


@pytest.fixture
def stack(tmp_path, monkeypatch):
    """The services, the Celery worker and beat (on their own Redis database), a stand-in policy."""
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    monkeypatch.setenv("GEARSHIFT_ORCHESTRATION__METRICS_PORT", str(WORKER_METRICS_PORT))
    with instant_policy_process() as policy_url:
        running = Stack(Settings(redis_url=REDIS_URL, log_level="WARNING").with_policy(policy_url), data_dir=str(tmp_path / "data"),
                        base_port=BASE_PORT, with_policy=False, with_loop=True)
        running.start()
        try:
            states = running.wait_ready(timeout=180)
            assert all(state == "SERVING" for _, state in states.values()), states
            assert "worker" in running.processes, running.loop
            yield running
        finally:
            running.stop()
            client.flushdb()


@pytest.fixture
def prometheus(stack, tmp_path):
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(stack)))
    process = subprocess.Popen([tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                f"--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}"], stdout=subprocess.DEVNULL,
                               stderr=(tmp_path / "prometheus.log").open("w"))
    try:
        until(lambda: ready() or process.poll() is not None, 60, "Prometheus to start")
        assert process.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
        yield process
    finally:
        process.terminate()
        process.wait(timeout=30)


def ready() -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{PROMETHEUS_PORT}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_every_dashboard_panel_has_series_after_episodes_of_each_mode(stack, prometheus):
    gateway = f"http://{stack.address('gateway')}/v1/chat/completions"
    with httpx.Client(timeout=120) as http:
        for model in MODELS:
            for n in range(EPISODES_PER_MODEL):
                reply = http.post(gateway, json={"model": model, "messages": [{"role": "user", "content": f"What is the capital of France? ({n})"}]})
                assert reply.status_code == 200, reply.text
    targets = len(SERVICE_NAMES) + 1
    until(lambda: len(query("up == 1")) == targets, 90, f"{targets} targets up (the worker's metrics come once it is ready)")
    until(lambda: query("sum(gearshift_executor_episodes_total) >= 8"), 30, "the episodes in the executor's metrics")
    time.sleep(3 * SCRAPE_SECONDS)  # a rate needs two samples inside its range

    modes = {series["metric"]["mode"] for series in query("gearshift_executor_episodes_total")}
    assert {"instant", "reasoning", "agentic"} <= modes, modes
    empty = [f"{board} / {title}: {expr}" for board, title, expr in panel_queries() if not query(expr)]
    assert not empty, "panel queries without series:\n" + "\n".join(empty)
