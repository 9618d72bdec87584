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
