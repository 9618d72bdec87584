"""Retries that cannot storm (issue 60): a real router process, whose policy server is down (a
stand-in, named as such, that counts every request reaching it: connections closed unanswered,
or 503s), called through the platform's own channel. A dependency's failure is not retried again
by the layer above it (the router answers UNAVAILABLE with pushback: one Route attempt, its
policy client's 4 requests; before, the channel retried the Route 4 times: 16), and a burst of
failing calls is throttled by the retry budgets (the policy client's token bucket): the figures
are measured and printed (pytest -s shows them)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import RoutingStrategy
from gearshift.api.router.v1 import router_pb2, router_pb2_grpc
from gearshift.clients import channel
from gearshift.errors import Unavailable
from gearshift.interceptors import RETRY_PUSHBACK_KEY
from gearshift.policy_client import PolicyClient, RetryBudget
from gearshift.settings import Settings

from tests.services.service_processes import DeadPolicy, environment, service_process

pytestmark = pytest.mark.slow("router processes started and their policy requests counted")

BURST = 40  # concurrent failing calls
ATTEMPTS = 4  # the channel's retry_attempts and the policy client's 1 + retries, both defaults
MAX_TOKENS = Settings().rpc.retry_max_tokens
ROUTE = router_pb2.RouteRequest(query="What is 17*23?", strategy=RoutingStrategy.ROUTING_STRATEGY_MODEL)


def router_environment(tmp_path, url: str, **extra: str) -> dict[str, str]:
    return environment(Settings().with_policy(url), tmp_path, GEARSHIFT_POLICY_CLIENT__BACKOFF_SECONDS="0.01", **extra)


async def route(stub) -> grpc.aio.AioRpcError | router_pb2.RouteResponse:
    try:
        return await stub.Route(ROUTE)
    except grpc.aio.AioRpcError as exc:
        return exc


def route_attempts(router) -> float:
    return router.metric("grpc_server_handled_total", service="gearshift.router.v1.Router", method="Route", code="UNAVAILABLE")


@pytest.mark.parametrize("down", ["close", "503"])
async def test_one_route_while_the_policy_server_is_down_makes_at_most_4_policy_requests(tmp_path, down):
    settings = Settings()
    async with DeadPolicy(down) as policy:
        with service_process("router", router_environment(tmp_path, policy.url), tmp_path / "router.log") as router:
            async with channel(router.address, settings) as ch:
                failed = await route(router_pb2_grpc.RouterStub(ch))
            attempts = route_attempts(router)
    print(f"\none Route, policy server down ({down}): {policy.requests} policy requests, {attempts:.0f} Route attempt(s) "
          f"(before: {ATTEMPTS} Route attempts x {ATTEMPTS} policy requests = {ATTEMPTS * ATTEMPTS})")
    assert isinstance(failed, grpc.aio.AioRpcError) and failed.code() == grpc.StatusCode.UNAVAILABLE, failed
    assert dict(failed.trailing_metadata())[RETRY_PUSHBACK_KEY] == "-1"  # the caller's channel was told not to retry
    assert attempts == 1
    assert policy.requests == ATTEMPTS  # at most 4; today 16


async def test_a_burst_of_routes_while_the_policy_server_is_down_is_throttled_by_the_retry_budget(tmp_path):
    """BURST concurrent Routes against a router whose policy server is down, with the default
    retry budget and with one too large to ever run out (retry_max_tokens 1000): the budget lets
    a few requests retry, then each Route makes one policy request."""
    settings = Settings()
    measured = {}
    async with DeadPolicy("503") as policy:
        for label, tokens in ((f"budget of {MAX_TOKENS} tokens", MAX_TOKENS), ("no budget (1000 tokens)", 1000)):
            env = router_environment(tmp_path, policy.url, GEARSHIFT_RPC__RETRY_MAX_TOKENS=str(tokens))
            with service_process("router", env, tmp_path / f"router-{tokens}.log") as router:
                before = policy.requests
                async with channel(router.address, settings) as ch:
                    stub = router_pb2_grpc.RouterStub(ch)
                    results = await asyncio.gather(*(route(stub) for _ in range(BURST)))
                    first = policy.requests - before
                    again = await asyncio.gather(*(route(stub) for _ in range(BURST)))  # the budget is spent now
                    second = policy.requests - before - first
                measured[label] = (first, second, route_attempts(router))
            assert all(isinstance(r, grpc.aio.AioRpcError) and r.code() == grpc.StatusCode.UNAVAILABLE for r in results + again)
    print(f"\n{BURST} concurrent Routes, twice, policy server down (503); at most {BURST} x {ATTEMPTS} = {BURST * ATTEMPTS} "
          f"policy requests a burst without a budget, {BURST * ATTEMPTS * ATTEMPTS} before pushback:")
    for label, (first, second, attempts) in measured.items():
        print(f"  {label}: {first} then {second} policy requests; {attempts:.0f} Route attempts for {2 * BURST} Routes")
    first, second, attempts = measured[f"budget of {MAX_TOKENS} tokens"]
    assert first <= BURST + MAX_TOKENS // 2 and second == BURST  # retries stop once half the tokens are gone
    assert attempts == 2 * BURST  # each Route once: pushback
    assert measured["no budget (1000 tokens)"][:2] == (BURST * ATTEMPTS, BURST * ATTEMPTS)


async def test_the_policy_clients_budget_recovers_with_successes():
    budget = RetryBudget(max_tokens=10, token_ratio=0.5)
    assert [budget.failed() for _ in range(6)] == [True, True, True, True, False, False]  # 9, 8, 7, 6, 5, 4 left
    for _ in range(4):
        budget.succeeded()  # 6 left
    assert budget.failed() is False  # 5: not more than half
    for _ in range(4):
        budget.succeeded()  # 7
    assert budget.failed() is True  # 6
    for _ in range(100):
        budget.succeeded()
    assert budget.tokens == 10


async def test_a_policy_client_with_its_budget_spent_tries_each_request_once_and_says_why():
    async with DeadPolicy("close") as policy:
        async with PolicyClient(policy.url, "smollm2", retries=3, backoff=0.01, retry_budget=RetryBudget(4, 0.1)) as client:
            with pytest.raises(Unavailable, match="after 2 attempt"):
                await client.complete("hi")  # 3 left, then 2: half of 4, no more retries
            assert policy.requests == 2
            with pytest.raises(Unavailable, match="after 1 attempt.*retry budget is spent"):
                await client.complete("hi")
            assert policy.requests == 3
