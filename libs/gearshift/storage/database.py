"""Engines for the store's database, its migration (Alembic `upgrade head`: `gearshift migrate`,
or the store at start-up) and the check that a database's schema is the one this code needs."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url

from gearshift.errors import FailedPrecondition

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


@dataclass(frozen=True)
class SchemaVersion:
    """Where a database's schema stands against this code's migrations. Revisions are named as
    their migration files are (0004_trajectory_feedback); one this code has no file for, as stored."""

    current: str | None  # None: no migration has run on the database
    head: str  # the newest revision this code's migrations reach
    behind: bool  # current is an ancestor of head (or None): `upgrade head` brings it there

    @property
    def is_current(self) -> bool:
        return self.current == self.head

    @property
    def unknown(self) -> bool:
        """A revision this code's migrations do not lead to: a newer release migrated it."""
        return not (self.is_current or self.behind)


class SchemaMismatch(FailedPrecondition):
    """The database's schema is not the one this code needs; the message is one line naming both
    revisions and what to do (the message alone: it survives Celery's JSON result backend)."""

    @classmethod
    def of(cls, version: SchemaVersion) -> SchemaMismatch:
        if version.unknown:
            return cls(f"database schema is at {version.current}, which this version does not know (its newest is "
                       f"{version.head}): run the gearshift version that migrated it, or a newer one")
        if version.current is None:
            return cls(f"database schema is empty, this version needs {version.head}: run gearshift migrate")
        return cls(f"database schema is at {version.current}, this version needs {version.head}: run gearshift migrate")


def schema_version(connection: Connection) -> SchemaVersion:
    """The database's revision (alembic_version) against this code's migration scripts."""
    scripts = ScriptDirectory.from_config(alembic_config())
    head = scripts.get_current_head()
    lineage = {script.revision: Path(script.path).stem for script in scripts.iterate_revisions(head, "base")}
    stored = ",".join(MigrationContext.configure(connection).get_current_heads()) or None
    if stored is None or stored in lineage:
        return SchemaVersion(stored and lineage[stored], lineage[head], behind=stored != head)
    return SchemaVersion(stored, lineage[head], behind=False)


def check_schema(engine: Engine) -> SchemaVersion:
    """The schema's version when it is this code's newest; SchemaMismatch otherwise. Changes nothing."""
    with engine.connect() as connection:
        version = schema_version(connection)
    if not version.is_current:
        raise SchemaMismatch.of(version)
    return version


def upgrade_to_head(engine: Engine) -> tuple[SchemaVersion, SchemaVersion]:
    """Brings the schema to the newest migration; returns its version before and after
    (idempotent; safe with several replicas starting at once on Postgres, which serialise on an
    advisory lock in env.py). A revision this code does not know raises SchemaMismatch and
    changes nothing. On Postgres "before" is read ahead of that lock: where another process
    migrated meanwhile, it is where the schema stood when this one started."""
    config = alembic_config()
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # start-up noise
    with engine.connect() as connection, _sqlite_foreign_keys_checked_at_the_end(connection):
        connection = connection.execution_options(**{WRITE: True})
        before = schema_version(connection)
        if before.unknown:
            raise SchemaMismatch.of(before)
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
        after = schema_version(connection)
        if connection.dialect.name == "sqlite" and (broken := connection.exec_driver_sql("PRAGMA foreign_key_check").all()):
            raise RuntimeError(f"the migration left {len(broken)} rows whose foreign key points nowhere; rolled back")
        connection.commit()
    return before, after


@contextlib.contextmanager
def _sqlite_foreign_keys_checked_at_the_end(connection: Connection) -> Iterator[None]:
    """SQLite alters a table by rebuilding it (copy, drop, rename: Alembic's batch mode). With
    foreign keys enforced, dropping a table that others reference fails (trajectories, once a
    checkpoint names its lineage) or cascades into their rows (checkpoints' lineage). SQLite's
    own procedure: enforcement off outside the transaction, PRAGMA foreign_key_check before
    the commit (upgrade_to_head), enforcement back on for the pooled connection."""
    if connection.dialect.name != "sqlite":
        yield
        return
    driver = connection.connection.driver_connection  # before the transaction begins: inside one, no-op
    driver.execute("PRAGMA foreign_keys=OFF")
    try:
        yield
    finally:
        connection.rollback()  # nothing left after a commit; after a failure, ends the transaction first
        driver.execute("PRAGMA foreign_keys=ON")
