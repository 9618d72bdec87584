"""Real Celery workers and beats as subprocesses for the orchestration tests: the real app
(standin_worker.py: training runs are the stand-in), a Redis database of the test's own, the
test's scratch Postgres database and, when asked, an embedded store in this process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis
from celery import Celery
from gearshift.embedded import embedded
from gearshift.orchestration.app import create_app
from gearshift.orchestration.journal import JobJournal, JobRun
from gearshift.settings import Settings

from tests import workers

REPO = Path(__file__).resolve().parents[3]
APP = "tests.libs.orchestration.standin_worker"


@dataclass
class Cluster:
    """Workers and beats started by a test, and what they share: the environment (settings),
    the data dir (so a second worker finds the first one's run directories), Redis and the journal."""

    root: Path
    env: dict[str, str]
    app: Celery
    redis: redis.Redis
    journal: JobJournal | None
    settings: Settings | None  # the test's side of the embedded store (its address, the token)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    hostnames: dict[str, str] = field(default_factory=dict)

    def _spawn(self, name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "wb")
        process = subprocess.Popen([sys.executable, "-m", "celery", "-A", APP, *command], cwd=REPO, env=self.env | env,
                                   stdout=log, stderr=subprocess.STDOUT)
        self.processes[name] = process
        return process

    def worker(self, name: str, queues: str = "default,training", **env: str) -> subprocess.Popen:
        self.hostnames[name] = f"{name}-{uuid.uuid4().hex[:6]}@test"
        return self._spawn(name, ["worker", "-Q", queues, "--concurrency", "1", "--loglevel", "INFO", "--hostname", self.hostnames[name],
                                  "--without-gossip", "--without-mingle"], env)

    def beat(self, name: str, **env: str) -> subprocess.Popen:
        return self._spawn(name, ["beat", "--schedule", str(self.root / f"{name}-schedule"), "--loglevel", "INFO"], env)

    async def ready(self, *names: str, timeout: float = 45.0) -> None:
        """Waits until each named worker answers a ping (it consumes)."""
        destinations = [self.hostnames[name] for name in names]
        deadline = time.monotonic() + timeout
        while True:
            replies = await asyncio.to_thread(self.app.control.ping, destination=destinations, timeout=0.5)
            if {host for reply in replies for host in reply} >= set(destinations):
                return
            dead = [name for name in names if self.processes[name].poll() is not None]
            assert not dead, f"exited: {dead}: {self.log(dead[0])}"
            assert time.monotonic() < deadline, f"workers not ready: {destinations}"

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")[-3000:]

    def starts(self) -> list[str]:
        """The stand-in training runs started (one line each)."""
        path = self.root / "starts"
        return path.read_text().split() if path.exists() else []

    def notes(self) -> list[str]:
        """What the stand-in tasks' work did (standin_worker.note), a line each."""
        path = self.root / "notes"
        return path.read_text().splitlines() if path.exists() else []

    def holder(self, run: JobRun) -> str:
        """The name of the worker whose pool process owns a journal row (owner = host:pid:token)."""
        pid = owner_pid(run)
        parent = int((Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1]).split()[1])
        return next(name for name, process in self.processes.items() if process.pid in (pid, parent))

    def meta(self, task_id: str) -> dict:
        """A task's record in the result backend as it is now (AsyncResult caches the first
        finished one, and a task handed out twice finishes twice)."""
        stored = self.redis.get(f"celery-task-meta-{task_id}")
        return json.loads(stored) if stored else {"status": "PENDING"}

    def task_results(self, name: str) -> list[dict]:
        """The stored results of every finished task of a name (the result backend's records)."""
        found = []
        for key in self.redis.scan_iter("celery-task-meta-*"):
            meta = json.loads(self.redis.get(key))
            if meta.get("name") == name and meta["status"] == "SUCCESS":
                found.append(meta["result"])
        return found

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
            process.wait()
        for pid_file in (self.root / "data" / "runs").glob("*/pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)  # a stand-in run leads its own session


def owner_pid(run: JobRun) -> int:
    """The process holding a journal row's lease (its owner token is host:pid:random)."""
    return int(run.owner.rsplit(":", 2)[1])


async def until(check: Callable[[], object], timeout: float, what: str, interval: float = 0.2):
    """Polls check() without blocking the event loop (the embedded store serves on it) until it
    returns something true; returns that."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        await asyncio.sleep(interval)
    return found


@contextlib.asynccontextmanager
async def cluster(tmp_path: Path, engine=None, run_seconds: float = 1.0, **orchestration) -> AsyncIterator[Cluster]:
    """This worker's Redis database (tests/workers.py) emptied for the test, the embedded store on the scratch database when an
    engine is given, and the environment every worker and beat of the test gets (orchestration
    settings by keyword)."""
    redis_url = workers.redis_url()
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    env = os.environ | {
        "GEARSHIFT_DATA_DIR": str(tmp_path / "data"),
        "GEARSHIFT_REDIS_URL": redis_url,
        "GEARSHIFT_LOG_LEVEL": "WARNING",
        "GEARSHIFT_ORCHESTRATION__METRICS_PORT": "0",
        "STANDIN_STARTS": str(tmp_path / "starts"),
        "STANDIN_NOTES": str(tmp_path / "notes"),
        "STANDIN_SECONDS": str(run_seconds),
    } | {f"GEARSHIFT_ORCHESTRATION__{name.upper()}": str(value) for name, value in orchestration.items()}
    async with contextlib.AsyncExitStack() as stack:
        journal = settings = None
        if engine is not None:
            url = engine.url.render_as_string(hide_password=False)
            settings = Settings(data_dir=tmp_path, metrics_port=0, database_url=url, log_level="WARNING")
            platform = await stack.enter_async_context(embedded(settings, ("store",)))
            env |= {"GEARSHIFT_DATABASE_URL": url, "GEARSHIFT_STORE_ADDR": platform.settings.store_addr}
            journal, settings = JobJournal(engine), platform.settings
        running = Cluster(tmp_path, env, create_app(redis_url), client, journal, settings)
        try:
            yield running
        finally:
            running.close()
            client.flushdb()
