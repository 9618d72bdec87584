"""The shared bootstrap over real loopback sockets: health, auth, status mapping, request ids."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import Mode, RoutingStrategy
from gearshift.api.router.v1 import router_pb2, router_pb2_grpc
from gearshift.clients import channel
from gearshift.server import running, start
from gearshift.services.router.service import FULL_NAME, build
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import SecretStr


async def test_health_reports_each_service(settings):
    async with running(await build(settings), settings) as server:
        async with channel(f"127.0.0.1:{server.port}", settings) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            for name in ("", FULL_NAME):
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=name))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_domain_errors_become_status_codes_with_request_id(settings):
    async with running(await build(settings), settings) as server:
        async with channel(f"127.0.0.1:{server.port}", settings) as ch:
            stub = router_pb2_grpc.RouterStub(ch)
            call = stub.Route(router_pb2.RouteRequest(query="   "))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "empty" in err.value.details()
            trailers = dict(await call.trailing_metadata())
            assert len(trailers["x-request-id"]) == 16

            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Route(router_pb2.RouteRequest(query="hi", forced_mode=42))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

            reply = await stub.Route(router_pb2.RouteRequest(query="hi", forced_mode=Mode.MODE_AGENTIC))
            assert reply.mode == Mode.MODE_AGENTIC and reply.strategy == RoutingStrategy.ROUTING_STRATEGY_FORCED


async def test_bytes_that_do_not_parse_are_invalid_argument(settings):
    async with running(await build(settings), settings) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            raw = ch.unary_unary(f"/{FULL_NAME}/Route", request_serializer=None, response_deserializer=None)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await raw(b"\xff\xff\xff\xff")
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "does not parse" in err.value.details()


async def test_token_is_required_when_configured(settings):
    secured = settings.model_copy(update={"auth_token": SecretStr("s3cret")})
    async with running(await build(secured), secured) as server:
        address = f"127.0.0.1:{server.port}"
        request = router_pb2.RouteRequest(query="hi", forced_mode=Mode.MODE_INSTANT)
        async with channel(address, settings) as anonymous:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await router_pb2_grpc.RouterStub(anonymous).Route(request)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # Health stays open for Kubernetes probes.
            reply = await health_pb2_grpc.HealthStub(anonymous).Check(health_pb2.HealthCheckRequest())
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        wrong = settings.model_copy(update={"auth_token": SecretStr("guess")})
        async with channel(address, wrong) as guessing:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await router_pb2_grpc.RouterStub(guessing).Route(request)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        async with channel(address, secured) as trusted:
            reply = await router_pb2_grpc.RouterStub(trusted).Route(request)
            assert reply.mode == Mode.MODE_INSTANT


async def test_streaming_calls_carry_the_token_too(settings):
    """A server-streaming call (as executor Solve, store Export) gets the token like a unary one:
    grpc.aio files each client interceptor under one call shape only."""
    from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
    from gearshift.services.executor.service import build as build_executor

    secured = settings.model_copy(update={"auth_token": SecretStr("s3cret")})
    async with running(await build_executor(secured), secured) as server:
        for client, allowed in ((settings, False), (secured, True)):
            async with channel(f"127.0.0.1:{server.port}", client) as ch:
                call = executor_pb2_grpc.ExecutorStub(ch).Solve(executor_pb2.SolveRequest(query="hi"), timeout=10)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async for _ in call:
                        pass
                # Authorized, the executor gets as far as calling the (absent) store or router.
                assert (err.value.code() != grpc.StatusCode.UNAUTHENTICATED) == allowed, err.value.details()


async def test_reflection_lists_the_services_only_when_enabled(settings):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    for enabled in (True, False):
        configured = settings.model_copy(update={"reflection": enabled})
        async with running(await build(configured), configured) as server:
            with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:  # the reflection client is synchronous
                database = ProtoReflectionDescriptorDatabase(ch)
                if enabled:
                    assert FULL_NAME in await asyncio.to_thread(database.get_services)
                else:
                    with pytest.raises(grpc.RpcError):
                        await asyncio.to_thread(database.get_services)


async def test_a_drain_ends_every_health_watch_with_not_serving_and_logs_no_traceback(settings, caplog):
    """A watch open when the drain begins, and one a client's health check opens during the drain
    (as a channel's health checking does once its watch ends): each sees NOT_SERVING, its stream
    ends with OK, nothing is logged as an error, and no call holds the drain to its grace."""
    caplog.set_level(logging.WARNING)
    server = await start(await build(settings), settings, port=0)
    seen: dict[str, list] = {"before": [], "during": []}

    async def watch(ch: grpc.aio.Channel, when: str) -> None:
        try:
            async for reply in health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest()):
                seen[when].append(reply.status)
        except grpc.aio.AioRpcError as error:
            seen[when].append(error.code())

    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        before = asyncio.ensure_future(watch(ch, "before"))
        while not seen["before"]:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        stopping = asyncio.ensure_future(server.stop(grace=5, notice=0.5))
        await asyncio.sleep(0.2)  # NOT_SERVING now, still listening
        during = asyncio.ensure_future(watch(ch, "during"))
        await stopping
        stopped_in = time.monotonic() - started
        await asyncio.wait_for(asyncio.gather(before, during), timeout=5)
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    assert seen == {"before": [serving, not_serving], "during": [not_serving]}
    assert stopped_in < 2, stopped_in  # the notice, not the grace
    problems = [record for record in caplog.records if record.levelno >= logging.ERROR or record.exc_info]
    assert not problems, "\n".join(f"{r.name}: {r.getMessage()}" for r in problems)
