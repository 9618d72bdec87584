"""The schema check and what it is for: a store started without its start-up migration (the
chart migrates in a Job before the rollout) refuses, in one line naming both revisions, a schema
older than it needs or newer than it knows, and serves on its own (SQLite and Postgres)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from gearshift.services.store.service import build
from gearshift.settings import Settings, get_settings
from gearshift.storage import SchemaMismatch, check_schema, create_store_engine, schema_version, upgrade_to_head

from tests.libs.storage.helpers import migrate
from tests.libs.storage.schemas import EMPTY, FIRST, FUTURE, HEAD, UNKNOWN, needs_migrate, stamp, stored_revision


@pytest.fixture
def engine(empty_database: str):
    engine = create_store_engine(empty_database, pool_size=1)
    yield engine
    engine.dispose()


def test_the_check_names_both_revisions_until_the_upgrade_reaches_head(engine: sa.Engine):
    with pytest.raises(SchemaMismatch) as refused:
        check_schema(engine)
    assert str(refused.value) == EMPTY
    migrate(engine, "0004")
    with pytest.raises(SchemaMismatch) as refused:
        check_schema(engine)
    assert str(refused.value) == needs_migrate("0004_trajectory_feedback")
    assert stored_revision(engine) == "0004"  # the check changed nothing

    before, after = upgrade_to_head(engine)
    assert (before.current, after.current) == ("0004_trajectory_feedback", HEAD)
    assert check_schema(engine) == after and after.is_current
    before, after = upgrade_to_head(engine)  # a second run changes nothing
    assert before == after and after.current == HEAD


def test_a_revision_this_code_does_not_know_is_refused_and_left_alone(engine: sa.Engine):
    upgrade_to_head(engine)
    stamp(engine, FUTURE)
    with engine.connect() as connection:
        version = schema_version(connection)
    assert version.unknown and not version.behind and (version.current, version.head) == (FUTURE, HEAD)
    for attempt in (check_schema, upgrade_to_head):
        with pytest.raises(SchemaMismatch) as refused:
            attempt(engine)
        assert str(refused.value) == UNKNOWN
    assert stored_revision(engine) == FUTURE


def store_settings(tmp_path: Path, url: str, migrate_on_start: bool) -> Settings:
    settings = Settings(data_dir=tmp_path, metrics_port=0, database_url=url)
    return settings.model_copy(update={"store": settings.store.model_copy(update={"migrate_on_start": migrate_on_start})})


async def test_a_store_without_start_up_migration_serves_only_on_its_own_schema(engine: sa.Engine, empty_database, tmp_path):
    settings = store_settings(tmp_path, empty_database, migrate_on_start=False)
    with pytest.raises(SystemExit) as refused:
        await build(settings)
    assert refused.value.code == f"store: {EMPTY}"
    migrate(engine, "0001")
    with pytest.raises(SystemExit) as refused:
        await build(settings)
    assert refused.value.code == "store: " + needs_migrate(FIRST)
    assert stored_revision(engine) == "0001"

    upgrade_to_head(engine)
    service = await build(settings)
    for close in service.on_close:
        await close()

    stamp(engine, FUTURE)
    for migrate_on_start in (False, True):  # a newer release's schema is refused either way
        with pytest.raises(SystemExit) as refused:
            await build(store_settings(tmp_path, empty_database, migrate_on_start))
        assert refused.value.code == f"store: {UNKNOWN}"
    assert stored_revision(engine) == FUTURE


async def test_a_store_with_start_up_migration_still_migrates(engine: sa.Engine, empty_database, tmp_path):
    migrate(engine, "0001")
    service = await build(store_settings(tmp_path, empty_database, migrate_on_start=True))
    for close in service.on_close:
        await close()
    assert check_schema(engine).current == HEAD


def test_the_orchestration_journal_migrates_or_checks_as_the_store_does(engine: sa.Engine, empty_database, tmp_path, monkeypatch):
    from gearshift.orchestration import tasks

    def journal(migrate_on_start: bool):
        monkeypatch.setenv("GEARSHIFT_STORE__MIGRATE_ON_START", str(migrate_on_start).lower())
        get_settings.cache_clear()
        tasks.journal.cache_clear()
        return tasks.journal()

    monkeypatch.setenv("GEARSHIFT_DATABASE_URL", empty_database)
    monkeypatch.setenv("GEARSHIFT_DATA_DIR", str(tmp_path))
    try:
        migrate(engine, "0001")
        with pytest.raises(SchemaMismatch) as refused:
            journal(migrate_on_start=False)
        assert str(refused.value) == needs_migrate(FIRST) and stored_revision(engine) == "0001"
        journal(migrate_on_start=True).engine.dispose()
        assert check_schema(engine).current == HEAD
        journal(migrate_on_start=False).engine.dispose()  # on its own schema the check passes
        stamp(engine, FUTURE)
        for migrate_on_start in (False, True):
            with pytest.raises(SchemaMismatch, match=f"^database schema is at {FUTURE}, which"):
                journal(migrate_on_start)
    finally:
        tasks.journal.cache_clear()
        get_settings.cache_clear()


def test_sqlite_enforces_foreign_keys_again_after_a_migration_succeeds_or_fails(tmp_path):
    """The upgrade turns enforcement off while it rebuilds tables; the pooled connection gets it back."""
    engine = create_store_engine(f"sqlite:///{tmp_path / 'store.db'}", pool_size=1)

    def enforced() -> bool:
        with engine.connect() as connection:
            return connection.exec_driver_sql("PRAGMA foreign_keys").scalar_one() == 1

    try:
        migrate(engine, "0001")
        upgrade_to_head(engine)
        assert enforced()
        stamp(engine, FUTURE)
        with pytest.raises(SchemaMismatch):
            upgrade_to_head(engine)
        assert enforced()
    finally:
        engine.dispose()
