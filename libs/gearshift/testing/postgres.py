"""Scratch Postgres databases for tests and benchmarks: created fresh, dropped afterwards."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import psycopg
from sqlalchemy.engine import make_url

# The server scratch databases are created on (trust auth on the CI machine).
POSTGRES_SERVER_URL = os.environ.get("GEARSHIFT_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


@contextlib.contextmanager
def scratch_database(prefix: str) -> Iterator[str]:
    """The URL of a fresh, empty database named PREFIX_<random>, dropped on the way out."""
    server = make_url(POSTGRES_SERVER_URL)
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = server.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
