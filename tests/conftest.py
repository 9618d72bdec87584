"""Shared fixtures: settings isolated from the developer's environment."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from gearshift.settings import Settings
from sqlalchemy.engine import make_url

# tests/images runs the built images as containers: only `make test-images` collects it (it needs
# a container engine and minutes of building), never the plain pytest run of `make test`.
collect_ignore = [] if os.environ.get("GEARSHIFT_IMAGE_TESTS") == "1" else ["images"]

# The Postgres server tests create their database on (trust auth on the CI machine).
POSTGRES_SERVER_URL = os.environ.get("GEARSHIFT_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(data_dir=tmp_path, metrics_port=0)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh, empty Postgres database for this test session, dropped afterwards."""
    server = make_url(POSTGRES_SERVER_URL)
    name = f"gearshift_test_{uuid.uuid4().hex[:12]}"
    admin = server.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
