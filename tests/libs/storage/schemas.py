"""What the schema tests expect, in one place: the revisions by their migration files' names
(read from the files, not through the code under test) and the one-line refusals."""

from __future__ import annotations

import sqlalchemy as sa
from gearshift.storage.database import MIGRATIONS

HEAD = sorted((MIGRATIONS / "versions").glob("0*.py"))[-1].stem  # the newest migration is the last file
FIRST = "0001_trajectories_and_checkpoints"
FUTURE = "0999_from_a_newer_release"  # what a newer release's migration would have stamped

EMPTY = f"database schema is empty, this version needs {HEAD}: run gearshift migrate"
UNKNOWN = (f"database schema is at {FUTURE}, which this version does not know (its newest is {HEAD}): "
           "run the gearshift version that migrated it, or a newer one")


def needs_migrate(current: str) -> str:
    return f"database schema is at {current}, this version needs {HEAD}: run gearshift migrate"


def stamp(engine: sa.Engine, revision: str) -> None:
    """Marks the database as migrated to a revision, as another release's migration would."""
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE alembic_version SET version_num = :revision"), {"revision": revision})


def stored_revision(engine: sa.Engine) -> str:
    with engine.connect() as connection:
        return connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one()
