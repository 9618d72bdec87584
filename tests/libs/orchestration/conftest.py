"""Fixtures: tiny checkpoints (random weights, the real SmolLM2 tokenizer), a fresh Postgres
database for the orchestration tables, and settings pointing at them."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest
from gearshift import weights
from gearshift.settings import Settings
from gearshift.storage import create_store_engine, upgrade_to_head
from sqlalchemy.engine import make_url

from tests.conftest import POSTGRES_SERVER_URL


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> list[Path]:
    """Two seeded tiny Llamas (different weights, same tokenizer) as checkpoint directories."""
    models = tmp_path_factory.mktemp("tiny-models")
    tokenizer = weights.smollm2_tokenizer(Settings().models_dir)
    return [weights.create_tiny(models / f"tiny-{seed}", seed=seed, tokenizer=tokenizer) for seed in (0, 1)]


@pytest.fixture
def orchestration_db():
    """A fresh, migrated Postgres database of its own (the store tests truncate the shared one)."""
    server = make_url(POSTGRES_SERVER_URL)
    name = f"gearshift_orch_{uuid.uuid4().hex[:12]}"
    admin = server.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    url = server.set(database=name).render_as_string(hide_password=False)
    engine = create_store_engine(url, pool_size=2)
    upgrade_to_head(engine)
    try:
        yield engine
    finally:
        engine.dispose()
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
