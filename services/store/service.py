"""Trajectory store wiring: engine, start-up migration (or the check that another step ran it),
repository, servicer."""

from __future__ import annotations

import asyncio
import logging

from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.server import Handler, Service
from gearshift.services.store.core import TrajectoryStore
from gearshift.services.store.servicer import TrajectoryStoreServicer
from gearshift.settings import Settings
from gearshift.storage import SchemaMismatch, TrajectoryRepository, check_schema, create_store_engine, upgrade_to_head
from sqlalchemy.engine import make_url

FULL_NAME = store_pb2.DESCRIPTOR.services_by_name["TrajectoryStore"].full_name

log = logging.getLogger("gearshift.store")

# Without connect_timeout a connect waits as long as TCP lets it (minutes) on a database host
# that stops answering, holding one of the store's few database threads: a handful of them held
# every call. Now a connect fails in this long and the call is UNAVAILABLE, which the executor
# retries and then spools (services/executor/durable_store.py).
CONNECT_TIMEOUT_SECONDS = 5


def with_connect_timeout(url: str) -> str:
    """A Postgres URL with connect_timeout, unless it names its own; other URLs as they are."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql" or "connect_timeout" in parsed.query:
        return url
    return parsed.update_query_dict({"connect_timeout": str(CONNECT_TIMEOUT_SECONDS)}).render_as_string(hide_password=False)


async def build(settings: Settings) -> Service:
    url = with_connect_timeout(settings.store_database_url())
    engine = create_store_engine(url, pool_size=settings.store.db_threads)
    try:
        await asyncio.to_thread(upgrade_to_head if settings.store.migrate_on_start else check_schema, engine)
    except SchemaMismatch as exc:
        engine.dispose()
        # A deployment error, not a bug: one line and exit 1 (uvloop.run lets SystemExit through).
        raise SystemExit(f"store: {exc}") from None
    log.info("store database: %s", engine.url.render_as_string(hide_password=True))
    store = TrajectoryStore(TrajectoryRepository(engine), settings.limits, settings.store)
    handler = Handler(store_pb2_grpc.add_TrajectoryStoreServicer_to_server, TrajectoryStoreServicer(store), FULL_NAME)
    return Service("store", [handler], on_close=[store.close])
