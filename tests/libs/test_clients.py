"""The client channels' service config, over real sockets: a deadline on every call from
settings, retries of idempotent methods on UNAVAILABLE (and of nothing else), and round_robin
that skips a replica whose health says NOT_SERVING. The servers are stand-in servicers (named
as such) whose answers the tests control; the channels and servers are the platform's own."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import Cost
from gearshift.api.reward.v1 import reward_pb2, reward_pb2_grpc
from gearshift.api.sandbox.v1 import sandbox_pb2, sandbox_pb2_grpc
from gearshift.clients import FULL_NAMES, RETRIED, channel, service_config
from gearshift.server import Handler, Service, start
from gearshift.settings import RpcSettings, Settings


class StandInReward(reward_pb2_grpc.RewardServicer):
    """Price answers after `delay` seconds, UNAVAILABLE for its first `refuse` calls; counts calls."""

    def __init__(self, delay: float = 0.0, refuse: int = 0):
        self.delay, self.refuse, self.calls = delay, refuse, 0

    async def Price(self, request, context):
        self.calls += 1
        if self.calls <= self.refuse:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "stand-in refusal")
        await asyncio.sleep(self.delay)
        return Cost(total_usd=1.0)


class StandInSandbox(sandbox_pb2_grpc.SandboxServicer):
    def __init__(self):
        self.calls = 0

    async def CloseSession(self, request, context):
        self.calls += 1
        await context.abort(grpc.StatusCode.UNAVAILABLE, "stand-in refusal")


async def serve(servicer, register, name: str, settings: Settings, host: str = "127.0.0.1", port: int = 0):
    return await start(Service(name, [Handler(register, servicer, FULL_NAMES[name])]), settings.model_copy(update={"host": host}), port=port)


def settings_with(**rpc) -> Settings:
    return Settings(rpc=RpcSettings(**rpc))


def test_every_retried_method_exists_and_the_config_names_each_service():
    config = json.loads(service_config(RpcSettings()))
    assert config["loadBalancingConfig"] == [{"round_robin": {}}] and config["healthCheckConfig"] == {"serviceName": ""}
    named = {(n["service"], n.get("method")) for entry in config["methodConfig"] for n in entry["name"]}
    for service in ("router", "planner", "reward", "sandbox", "store", "executor"):
        assert any(s.startswith(f"gearshift.{service}.") and m is None for s, m in named), service
    from google.protobuf import descriptor_pool

    for service, methods in RETRIED.items():
        descriptor = descriptor_pool.Default().FindServiceByName(FULL_NAMES[service])
        assert set(methods) <= {m.name for m in descriptor.methods}, service
    assert "Solve" not in str(RETRIED) and "CloseSession" not in RETRIED["sandbox"]


async def test_a_call_without_a_timeout_gets_its_services_deadline():
    settings = settings_with(deadline_seconds={"reward": 0.3})
    server = await serve(StandInReward(delay=2.0), reward_pb2_grpc.add_RewardServicer_to_server, "reward", settings)
    try:
        async with channel(f"127.0.0.1:{server.port}", settings) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await reward_pb2_grpc.RewardStub(ch).Price(reward_pb2.PriceRequest())
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        await server.stop(0)


async def test_an_idempotent_call_is_retried_on_unavailable_and_a_bounded_number_of_times():
    settings = settings_with(retry_attempts=3, retry_backoff_seconds=0.01)
    twice = StandInReward(refuse=2)
    server = await serve(twice, reward_pb2_grpc.add_RewardServicer_to_server, "reward", settings)
    try:
        async with channel(f"127.0.0.1:{server.port}", settings) as ch:
            reply = await reward_pb2_grpc.RewardStub(ch).Price(reward_pb2.PriceRequest())
        assert reply.total_usd == 1.0 and twice.calls == 3
        always = StandInReward(refuse=100)
        server2 = await serve(always, reward_pb2_grpc.add_RewardServicer_to_server, "reward", settings)
        async with channel(f"127.0.0.1:{server2.port}", settings) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await reward_pb2_grpc.RewardStub(ch).Price(reward_pb2.PriceRequest())
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and always.calls == 3
        await server2.stop(0)
    finally:
        await server.stop(0)


async def test_a_call_that_is_not_idempotent_is_not_retried():
    settings = settings_with(retry_attempts=4, retry_backoff_seconds=0.01)
    sandbox = StandInSandbox()
    server = await serve(sandbox, sandbox_pb2_grpc.add_SandboxServicer_to_server, "sandbox", settings)
    try:
        async with channel(f"127.0.0.1:{server.port}", settings) as ch:
            with pytest.raises(grpc.aio.AioRpcError):
                await sandbox_pb2_grpc.SandboxStub(ch).CloseSession(sandbox_pb2.CloseSessionRequest(session_id="s"))
        assert sandbox.calls == 1
    finally:
        await server.stop(0)


async def test_round_robin_spreads_calls_and_skips_a_replica_that_says_not_serving():
    settings = Settings()
    replicas = [StandInReward() for _ in range(3)]
    servers = []
    port = 0
    for index, servicer in enumerate(replicas):  # one port on three loopback addresses
        server = await serve(servicer, reward_pb2_grpc.add_RewardServicer_to_server, "reward", settings, f"127.0.0.{index + 2}", port)
        port = server.port
        servers.append(server)
    try:
        target = "ipv4:" + ",".join(f"127.0.0.{i + 2}:{port}" for i in range(3))
        async with channel(target, settings) as ch:
            stub = reward_pb2_grpc.RewardStub(ch)
            for _ in range(30):
                await stub.Price(reward_pb2.PriceRequest())
            assert min(r.calls for r in replicas) >= 5, [r.calls for r in replicas]
            await servers[0].health.enter_graceful_shutdown()  # draining: NOT_SERVING, still listening
            await asyncio.sleep(0.3)
            before = [r.calls for r in replicas]
            for _ in range(30):
                await stub.Price(reward_pb2.PriceRequest())
            assert replicas[0].calls == before[0] and min(replicas[i].calls - before[i] for i in (1, 2)) >= 10
    finally:
        for server in servers:
            await server.stop(0)
