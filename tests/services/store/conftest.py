"""A store service on a free loopback port, on each backend, and a way to count its rows."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from gearshift.api.store.v1 import store_pb2_grpc
from gearshift.clients import channel
from gearshift.server import running
from gearshift.services.store.service import build
from gearshift.settings import Settings
from gearshift.storage import TrajectoryRepository, create_store_engine

from tests.libs.storage.helpers import migrated_postgres_url, store_database_url  # noqa: F401


@pytest.fixture
def store_settings(settings: Settings, store_database_url: str) -> Settings:
    store = settings.store.model_copy(update={"export_chunk_size": 4})  # several chunks per export
    return settings.model_copy(update={"database_url": store_database_url, "store": store})


@pytest.fixture
async def store_address(store_settings: Settings) -> AsyncIterator[str]:
    async with running(await build(store_settings), store_settings) as server:
        yield f"127.0.0.1:{server.port}"


@pytest.fixture
async def stub(store_address: str, store_settings: Settings) -> AsyncIterator[store_pb2_grpc.TrajectoryStoreStub]:
    async with channel(store_address, store_settings) as ch:
        yield store_pb2_grpc.TrajectoryStoreStub(ch)


@pytest.fixture
def stored_rows(store_database_url: str) -> Iterator[Callable[[], dict[str, int]]]:
    """Counts every table straight from the database, to prove what was (not) written."""
    engine = create_store_engine(store_database_url, pool_size=1)
    repository = TrajectoryRepository(engine)

    def count() -> dict[str, int]:
        return {"trajectories": repository.count(), "checkpoints": len(repository.list_checkpoints(limit=10_000))}

    yield count
    engine.dispose()
