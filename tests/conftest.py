"""Shared fixtures: settings isolated from the developer's environment."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from gearshift.settings import Settings
from gearshift.testing.postgres import scratch_database

# tests/images runs the built images as containers: only `make test-images` collects it (it needs
# a container engine and minutes of building), never the plain pytest run of `make test`.
collect_ignore = [] if os.environ.get("GEARSHIFT_IMAGE_TESTS") == "1" else ["images"]



@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(data_dir=tmp_path, metrics_port=0)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh, empty Postgres database for this test session, dropped afterwards."""
    with scratch_database("gearshift_test") as url:
        yield url


# Two real vLLM CPU servers with run-time weight loading, shared by every test that asks (once per
# session: registered here, not in each directory's conftest, or each would start its own pair).
from tests.vllm_servers import vllm_servers  # noqa: E402, F401
