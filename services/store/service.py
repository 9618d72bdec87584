"""Trajectory store wiring: engine, start-up migration, repository, servicer."""

from __future__ import annotations

import asyncio
import logging

from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.server import Handler, Service
from gearshift.services.store.core import TrajectoryStore
from gearshift.services.store.servicer import TrajectoryStoreServicer
from gearshift.settings import Settings
from gearshift.storage import TrajectoryRepository, create_store_engine, upgrade_to_head

FULL_NAME = store_pb2.DESCRIPTOR.services_by_name["TrajectoryStore"].full_name

log = logging.getLogger("gearshift.store")


async def build(settings: Settings) -> Service:
    url = settings.store_database_url()
    engine = create_store_engine(url, pool_size=settings.store.db_threads)
    if settings.store.migrate_on_start:
        await asyncio.to_thread(upgrade_to_head, engine)
    log.info("store database: %s", engine.url.render_as_string(hide_password=True))
    store = TrajectoryStore(TrajectoryRepository(engine), settings.limits, settings.store)
    handler = Handler(store_pb2_grpc.add_TrajectoryStoreServicer_to_server, TrajectoryStoreServicer(store), FULL_NAME)
    return Service("store", [handler], on_close=[store.close])
