"""Alembic environment: runs on the connection the store hands over (start-up), or on
GEARSHIFT_DATABASE_URL / the embedded SQLite file when run from the alembic command line."""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context

from gearshift.storage.models import Base

config = context.config
target_metadata = Base.metadata

# Any constant works; it only has to be the same for every store replica.
MIGRATION_LOCK = 0x6765_6172  # "gear"


def run_on(connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Replicas starting together migrate one after another.
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        run_on(connection)
        return
    if config.config_file_name:
        fileConfig(config.config_file_name, disable_existing_loggers=False)
    from gearshift.settings import get_settings
    from gearshift.storage.database import create_store_engine

    engine = create_store_engine(get_settings().store_database_url(), pool_size=1)
    with engine.connect() as connection:
        run_on(connection)
        connection.commit()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
run_online()
