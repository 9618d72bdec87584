"""The bound on a gRPC server's calls in flight (limits.max_concurrent_rpcs), over real loopback
sockets on the shared bootstrap: a call beyond it is refused RESOURCE_EXHAUSTED at once, not
queued, and the server takes calls again as soon as one ends."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from gearshift.server import running
from gearshift.services.router.service import build
from grpc_health.v1 import health_pb2, health_pb2_grpc

BOUND = 2


async def test_a_call_over_the_servers_bound_is_resource_exhausted(settings):
    bounded = settings.model_copy(update={"limits": settings.limits.model_copy(update={"max_concurrent_rpcs": BOUND})})
    async with running(await build(bounded), bounded) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            health = health_pb2_grpc.HealthStub(ch)
            # Health watches are calls that stay open: BOUND of them fill the server.
            watches = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(BOUND)]
            for watch in watches:
                assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

            watches[0].cancel()
            for _ in range(100):  # the server counts the cancelled call out as it notices the cancellation
                try:
                    reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
                    break
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    await asyncio.sleep(0.02)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            watches[1].cancel()
