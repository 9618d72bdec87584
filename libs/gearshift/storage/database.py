"""Engines for the store's database and the start-up migration (Alembic `upgrade head`)."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

MIGRATIONS = Path(__file__).parent / "migrations"

# Execution option that marks a connection's next transaction as a writer (see _sqlite_setup).
WRITE = "gearshift_write"


def create_store_engine(url: str, pool_size: int = 4) -> Engine:
    """An engine for a Postgres URL or a SQLite file URL, tuned for the store's access pattern:
    a few worker threads, short transactions."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, pool_size=pool_size, max_overflow=pool_size, connect_args={"timeout": 30})
        _sqlite_setup(engine)
        return engine
    return create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


def _sqlite_setup(engine: Engine) -> None:
    """WAL (readers do not block the writer), enforced foreign keys, and transactions that
    start as writers with BEGIN IMMEDIATE when they will write: a deferred transaction that
    reads first and writes later fails at once with SQLITE_BUSY instead of waiting."""

    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection):
        writes = connection.get_execution_options().get(WRITE, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")


def alembic_config() -> Config:
    """The Alembic configuration shipped in this package."""
    config = Config(str(MIGRATIONS / "alembic.ini"))
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def upgrade_to_head(engine: Engine) -> None:
    """Brings the schema to the newest migration (idempotent; safe with several replicas
    starting at once on Postgres, which serialise on an advisory lock in env.py)."""
    config = alembic_config()
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # start-up noise
    with engine.connect() as connection:
        connection = connection.execution_options(**{WRITE: True})
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
        connection.commit()
