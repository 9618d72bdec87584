"""A database host that stops answering makes the store's calls UNAVAILABLE within its connect
timeout (services/store/service.py), instead of holding its database threads for as long as TCP
waits: the store is reached through a TCP proxy that accepts connections and never answers."""

from __future__ import annotations

import time

import grpc
import pytest
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.server import running
from gearshift.services.store.service import CONNECT_TIMEOUT_SECONDS, build, with_connect_timeout
from sqlalchemy.engine import make_url

from tests.libs.storage.helpers import make_trajectory
from tests.tcp_proxy import tcp_proxy

MARGIN_SECONDS = 3.0


def test_a_postgres_url_gets_a_connect_timeout_unless_it_names_one():
    assert make_url(with_connect_timeout("postgresql+psycopg://u@db:5432/g")).query == {"connect_timeout": str(CONNECT_TIMEOUT_SECONDS)}
    assert with_connect_timeout("postgresql+psycopg://u@db/g?connect_timeout=1") == "postgresql+psycopg://u@db/g?connect_timeout=1"
    assert with_connect_timeout("sqlite:////tmp/store.db") == "sqlite:////tmp/store.db"


@pytest.mark.slow("waits out the connect timeout")
async def test_a_database_that_stops_answering_makes_put_unavailable_within_the_connect_timeout(settings, postgres_url):
    url = make_url(postgres_url)
    async with tcp_proxy(url.host, url.port) as proxy:
        proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        store_settings = settings.model_copy(update={"database_url": proxied})
        async with running(await build(store_settings), store_settings) as server:
            # A bare channel: no retries, so one call shows one connect's wait.
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
                stub = store_pb2_grpc.TrajectoryStoreStub(ch)
                assert (await stub.Put(store_pb2.PutRequest(trajectories=[make_trajectory()]))).inserted == 1

                proxy.cut(hold_new=True)
                started = time.monotonic()
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await stub.Put(store_pb2.PutRequest(trajectories=[make_trajectory()]), timeout=30)
                waited = time.monotonic() - started
                assert raised.value.code() == grpc.StatusCode.UNAVAILABLE  # before: DEADLINE_EXCEEDED after 30 s
                assert proxy.refused >= 1 and waited < CONNECT_TIMEOUT_SECONDS + MARGIN_SECONDS

                proxy.restore()
                assert (await stub.Put(store_pb2.PutRequest(trajectories=[make_trajectory()]))).inserted == 1
