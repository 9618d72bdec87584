"""Shared fixtures: settings isolated from the developer's environment and from the other
pytest-xdist workers (tests/workers.py), Postgres, and the vLLM pair. How the suite is grouped and
spread over the workers is the plugin tests/scheduling.py; the guard against slow tests,
tests/durations.py."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator

import pytest
from gearshift.settings import Settings
from gearshift.testing.postgres import scratch_database

from tests import workers

pytest_plugins = ["tests.durations", "tests.scheduling"]

# tests/images runs the built images as containers: only `make test-images` collects it (it needs
# a container engine and minutes of building), never the plain pytest run of `make test`.
collect_ignore = [] if os.environ.get("GEARSHIFT_IMAGE_TESTS") == "1" else ["images"]

# glibc's malloc hands each block over its mmap threshold back to the kernel when freed, so every
# training step faults its buffers in again: a tiny Llama's 6 steps took 5.2 to 5.6 s with 800k
# page faults, 3.9 to 4.1 s with 270k once freed memory stays in the heap (benchmarks/malloc_steps.py).
# Set here, before xdist starts its workers, for them and every process they start (ranks, vLLM,
# services); the memory tests' ranks preload jemalloc, as the training image does.
os.environ.setdefault("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=4294967296")


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(data_dir=tmp_path, metrics_port=0)


@pytest.fixture(scope="session", autouse=True)
def worker_environment(tmp_path_factory) -> Iterator[None]:
    """The default data directory, Redis database and cores of this worker alone (tests/workers.py)."""
    threads = workers.threads_per_worker()
    if "torch" in sys.modules:  # imported by the collected modules; one imported later reads OMP_NUM_THREADS below
        sys.modules["torch"].set_num_threads(threads)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GEARSHIFT_DATA_DIR", str(tmp_path_factory.mktemp("data-dir")))
        patch.setenv("GEARSHIFT_REDIS_URL", workers.redis_url())
        patch.setenv("OMP_NUM_THREADS", str(threads))  # what the worker starts: trainers, services
        patch.setenv("GEARSHIFT_POLICY_SERVER__THREADS", str(threads))
        yield


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh, empty Postgres database for this test session, dropped afterwards."""
    with scratch_database("gearshift_test") as url:
        yield url


# Two real vLLM CPU servers with run-time weight loading, shared by every test that asks (once per
# session: registered here, not in each directory's conftest, or each would start its own pair).
from tests.vllm_servers import last_user, stop_vllm_servers, vllm_pair, vllm_servers  # noqa: E402, F401

_LAST_VLLM_USER: list[str | None] = [None]


def pytest_collection_finish(session) -> None:
    _LAST_VLLM_USER[0] = last_user(session.items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        return (yield)
    finally:
        # The pair stops after the last test that uses it (and its fixtures) is torn down, not at
        # the end of the session: the tests after it get its ~8 GiB back.
        if item.nodeid == _LAST_VLLM_USER[0]:
            stop_vllm_servers()
        # A real model's weights held in a reference cycle (a closed server's event loop, a
        # client) go now, not at a full collection that may come only after the next model loads.
        if item.get_closest_marker("model"):
            gc.collect()
