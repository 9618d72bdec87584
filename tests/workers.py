"""What each pytest-xdist worker owns alone when the suite runs in parallel (`make test` runs
`pytest -n 2`; tests/conftest.py groups the tests):

- Postgres: scratch_database names every database at random;
- Redis: one database of its own (redis_url below), which its tests flush;
- files: xdist gives each worker its own basetemp (tmp_path), and tests/conftest.py points the
  default data directory (GEARSHIFT_DATA_DIR) into it;
- cores: an equal share of the machine's (threads_per_worker below): torch and the policy
  server's generation in the worker and in what it starts run on that many threads, since two
  OpenMP threads sharing a core with the other worker's tests spin waiting for each other (the
  gateway's tests beside a busy core: 130 s on two threads, 72 s on one);
- ports: servers take free ports from the kernel, or, where a test must name the port first,
  gearshift.testing.ports.free_port draws one from 10000-19999 (below the ephemeral range, which
  any process's connections and binds to port 0 take from); the few tests that name fixed ports
  (whole stacks as processes, `gearshift up --base-port`, from 20000 up) are in the xdist group
  FIXED_PORTS, which one worker runs one test at a time.

A plain `pytest` run (no xdist) is worker 0."""

from __future__ import annotations

import os

from gearshift.settings import PolicyServerSettings

FIXED_PORTS = "fixed-ports"
REDIS_DATABASES = 16  # Redis' default `databases`


def worker_index() -> int:
    """0, 1, ... for xdist's gw0, gw1, ...; 0 without xdist."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


def redis_url() -> str:
    """This worker's own Redis database (database 0 is left to a developer's `gearshift up --loop`)."""
    database = 1 + worker_index()
    assert database < REDIS_DATABASES, f"{database} workers: Redis has {REDIS_DATABASES} databases, one per worker and 0 spare"
    return f"redis://127.0.0.1:6379/{database}"


def threads_per_worker() -> int:
    """This worker's share of the machine's cores: all of them without xdist."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, (os.cpu_count() or 1) // workers)


def policy_server(model: str, **update) -> PolicyServerSettings:
    """The built-in server's settings for model on a free port and this worker's threads."""
    return PolicyServerSettings(**{"model": model, "port": 0, "threads": threads_per_worker(), **update})
