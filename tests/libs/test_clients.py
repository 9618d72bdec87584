"""The client channels' service config, over real sockets: a deadline on every call from
settings, or sooner the deadline of the work in hand (which a server hands on to the calls its
handler makes), retries of idempotent methods on UNAVAILABLE (and of nothing else) within a
retry budget, none of a call whose server pushed back, and round_robin that skips a replica
whose health says NOT_SERVING. The servers are stand-in servicers (named as such) whose answers
the tests control; the channels and servers are the platform's own."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import Cost
from gearshift.api.reward.v1 import reward_pb2, reward_pb2_grpc
from gearshift.api.sandbox.v1 import sandbox_pb2, sandbox_pb2_grpc
from gearshift import deadlines
from gearshift.clients import FULL_NAMES, RETRIED, channel, service_config
from gearshift.errors import Unavailable
from gearshift.server import Handler, Service, start
from gearshift.settings import RpcSettings, Settings


class StandInReward(reward_pb2_grpc.RewardServicer):
    """Price answers after `delay` seconds, UNAVAILABLE for its first `refuse` calls; counts calls.
    It records the deadline the caller sent and the one its handler had in hand for what it calls
    (gearshift.deadlines); CostOfPass fails as a handler does when what it called was unavailable."""

    def __init__(self, delay: float = 0.0, refuse: int = 0):
        self.delay, self.refuse, self.calls = delay, refuse, 0
        self.time_remaining: list[float | None] = []
        self.in_hand: list[float | None] = []

    async def Price(self, request, context):
        self.calls += 1
        self.time_remaining.append(context.time_remaining())
        self.in_hand.append(deadlines.remaining())
        if self.calls <= self.refuse:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "stand-in refusal")
        await asyncio.sleep(self.delay)
        return Cost(total_usd=1.0)

    async def CostOfPass(self, request, context):
        self.calls += 1
        raise Unavailable("stand-in: the judge it asked is down")


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
            assert replicas[0].calls == before[0] and min(replicas[i].calls - before[i] for i in (1, 2)) >= 5  # spread (21 and 9 seen on a loaded machine)
    finally:
        for server in servers:
            await server.stop(0)


async def test_the_deadline_in_hand_bounds_a_call_and_travels_to_the_handler():
    settings = settings_with(deadline_seconds={"reward": 30.0})
    slow, quick = StandInReward(delay=2.0), StandInReward()
    server = await serve(slow, reward_pb2_grpc.add_RewardServicer_to_server, "reward", settings)
    quick_server = await serve(quick, reward_pb2_grpc.add_RewardServicer_to_server, "reward", settings)
    try:
        async with channel(f"127.0.0.1:{server.port}", settings) as ch, channel(f"127.0.0.1:{quick_server.port}", settings) as quick_ch:
            with deadlines.within(time.monotonic() + 0.5):
                await reward_pb2_grpc.RewardStub(quick_ch).Price(reward_pb2.PriceRequest())
                started = time.monotonic()
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await reward_pb2_grpc.RewardStub(ch).Price(reward_pb2.PriceRequest(), timeout=10)  # the sooner wins
                took = time.monotonic() - started
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and took < 1.5  # not the 10 s it asked for
        assert 0 < quick.time_remaining[0] <= 0.5 and 0 < slow.time_remaining[0] <= 0.5  # the server was told
        assert 0 < quick.in_hand[0] <= 0.5  # and its handler had it in hand, for what it calls in turn
    finally:
        await server.stop(0)
        await quick_server.stop(0)


async def test_a_handler_failing_on_an_unavailable_dependency_is_not_retried():
    settings = settings_with(retry_attempts=4, retry_backoff_seconds=0.01)
    reward = StandInReward()
    server = await serve(reward, reward_pb2_grpc.add_RewardServicer_to_server, "reward", settings)
    try:
        async with channel(f"127.0.0.1:{server.port}", settings) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await reward_pb2_grpc.RewardStub(ch).CostOfPass(reward_pb2.CostOfPassRequest())
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "judge it asked is down" in err.value.details()
        assert reward.calls == 1  # CostOfPass is retried on UNAVAILABLE, but the server pushed back
        assert dict(err.value.trailing_metadata())["grpc-retry-pushback-ms"] == "-1"
    finally:
        await server.stop(0)


def test_the_service_config_carries_the_retry_budget():
    config = json.loads(service_config(RpcSettings(retry_max_tokens=20, retry_token_ratio=0.25)))
    assert config["retryThrottling"] == {"maxTokens": 20, "tokenRatio": 0.25}


async def test_a_burst_of_failing_calls_is_throttled_by_the_retry_budget():
    """A replica failing every call with UNAVAILABLE (gRPC retries those: no pushback), BURST calls
    at once, twice, with the default budget and with one too large to run out: gRPC's retry
    throttling (one budget per target) lets a few calls retry, then each is tried once."""
    calls, attempts = 40, 4
    measured = {}
    for tokens in (RpcSettings().retry_max_tokens, 1000):
        settings = settings_with(retry_attempts=attempts, retry_backoff_seconds=0.01, retry_max_tokens=tokens)
        failing = StandInReward(refuse=10**6)
        server = await serve(failing, reward_pb2_grpc.add_RewardServicer_to_server, "reward", settings)
        try:
            async with channel(f"127.0.0.1:{server.port}", settings) as ch:
                stub = reward_pb2_grpc.RewardStub(ch)
                bursts = []
                for _ in range(2):
                    before = failing.calls
                    results = await asyncio.gather(*(stub.Price(reward_pb2.PriceRequest()) for _ in range(calls)), return_exceptions=True)
                    assert all(isinstance(r, grpc.aio.AioRpcError) and r.code() == grpc.StatusCode.UNAVAILABLE for r in results)
                    bursts.append(failing.calls - before)
                measured[tokens] = bursts
        finally:
            await server.stop(0)
    print(f"\n{calls} concurrent calls to a failing replica, twice ({attempts} attempts each at most: {calls * attempts}): "
          f"attempts reaching it with a budget of {RpcSettings().retry_max_tokens} tokens {measured[RpcSettings().retry_max_tokens]}, "
          f"with 1000 tokens {measured[1000]}")
    first, second = measured[RpcSettings().retry_max_tokens]
    assert first <= calls + RpcSettings().retry_max_tokens and second == calls
    assert measured[1000] == [calls * attempts, calls * attempts]
