"""Storage for trajectories and checkpoints: SQLAlchemy 2 models, Alembic migrations shipped in
this package, and a transport-free repository. Postgres in production, a SQLite file embedded."""

from gearshift.storage.database import (
    SchemaMismatch,
    SchemaVersion,
    check_schema,
    create_store_engine,
    schema_version,
    upgrade_to_head,
)
from gearshift.storage.repository import Keyset, TrajectoryFilter, TrajectoryRepository

__all__ = [
    "Keyset",
    "SchemaMismatch",
    "SchemaVersion",
    "TrajectoryFilter",
    "TrajectoryRepository",
    "check_schema",
    "create_store_engine",
    "schema_version",
    "upgrade_to_head",
]
