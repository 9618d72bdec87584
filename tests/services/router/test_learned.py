"""The router service serving strategy LEARNED over real gRPC, from routers trained on a real
store, and hot-reloading a newly published version while requests keep flowing."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import Checkpoint, RoutingStrategy
from gearshift.api.router.v1 import router_pb2, router_pb2_grpc
from gearshift.api.store.v1 import store_pb2
from gearshift.clients import channel
from gearshift.jobs.router.config import RouterConfig
from gearshift.jobs.router.trainer import train_async
from gearshift.protocol import a2fm
from gearshift.routing.registry import publish
from gearshift.server import running
from gearshift.services.router.service import build
from gearshift.settings import LearnedRouterSettings

from tests.libs.routing.synthetic import AGENTIC, INSTANT, REASONING, SUITE, put, running_store, world

LEARNED = RoutingStrategy.ROUTING_STRATEGY_LEARNED
BIG = "What is 73918273 * 1928374655?"
FACT = "What is the capital of Peru?"


async def train(settings, version: str, embedding: str = "static") -> None:
    config = RouterConfig(task_source=SUITE, embedding=embedding, bootstrap_samples=50, store_addr=settings.store_addr,
                          output={"dir": settings.data_dir / "routers" / version, "checkpoint_id": version})
    await train_async(config)


@contextlib.asynccontextmanager
async def router_service(settings):
    configured = settings.model_copy(update={"learned_router": LearnedRouterSettings(poll_seconds=0.1, accuracy_floor=0.5)})
    async with running(await build(configured), configured) as server, channel(f"127.0.0.1:{server.port}", configured) as ch:
        yield router_pb2_grpc.RouterStub(ch)


@pytest.fixture
async def store(settings):
    async with running_store(settings) as (configured, stub):
        await put(stub, world("eval-1", {"train": 60, "dev": 15}))
        yield configured, stub


async def test_learned_routing_over_grpc(store):
    settings, stub = store
    await train(settings, "router-v1")
    await publish(stub, "router-v1")
    async with router_service(settings) as router:  # loads the published router at start-up
        big = await router.Route(router_pb2.RouteRequest(query=BIG, strategy=LEARNED))
        fact = await router.Route(router_pb2.RouteRequest(query=FACT, strategy=LEARNED))
    assert (big.mode, fact.mode) == (AGENTIC, INSTANT)
    assert big.strategy == LEARNED and big.router_version == "router-v1"
    assert big.assistant_prefix == a2fm.episode_prefix(AGENTIC, a2fm.FORCED_JUSTIFICATION[AGENTIC])
    scores = {s.mode: s for s in big.scores}
    assert set(scores) == {INSTANT, REASONING, AGENTIC}
    assert scores[AGENTIC].score > 0.5 > scores[INSTANT].score
    # expected cost of pass = the mode's expected cost / its probability; agentic costs ~1e-4 an attempt
    assert scores[AGENTIC].expected_cost_of_pass_usd == pytest.approx(1e-4 / scores[AGENTIC].score, rel=0.1)
    assert big.usage.input_tokens == 0 and big.attempts == 0  # no policy call


async def test_hot_reload_under_load_drops_no_request(store):
    settings, stub = store
    await train(settings, "router-v1")
    await publish(stub, "router-v1")
    seen: list[list[str]] = [[] for _ in range(4)]
    errors: list[BaseException] = []
    stop = asyncio.Event()

    async def caller(router, log: list[str]) -> None:
        while not stop.is_set():
            try:
                reply = await router.Route(router_pb2.RouteRequest(query=BIG, strategy=LEARNED))
            except grpc.aio.AioRpcError as exc:
                errors.append(exc)
                continue
            log.append(reply.router_version)

    async with router_service(settings) as router:
        callers = [asyncio.create_task(caller(router, log)) for log in seen]
        await asyncio.sleep(0.3)
        # a new version with a different feature spec: the service loads a new extractor too
        await train(settings, "router-v2", embedding="none")
        await publish(stub, "router-v2")
        for _ in range(100):
            await asyncio.sleep(0.05)
            if all(log and log[-1] == "router-v2" for log in seen):
                break
        await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*callers)

    assert errors == []
    for log in seen:
        assert log[0] == "router-v1" and log[-1] == "router-v2"
        switch = log.index("router-v2")
        assert set(log[switch:]) == {"router-v2"}  # never back to the old version
    assert sum(map(len, seen)) > 40


async def test_start_without_a_router_then_publish_and_survive_a_broken_artefact(store):
    settings, stub = store
    async with router_service(settings) as router:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await router.Route(router_pb2.RouteRequest(query=FACT, strategy=LEARNED))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION

        await train(settings, "router-v1", embedding="none")
        await publish(stub, "router-v1")
        reply = await _wait_for_version(router, "router-v1")
        assert reply.mode == INSTANT

        broken = Checkpoint(id="router-broken", kind="router", uri=str(settings.data_dir / "missing"))
        await stub.RegisterCheckpoint(store_pb2.RegisterCheckpointRequest(checkpoint=broken))
        await publish(stub, "router-broken")
        await asyncio.sleep(0.5)  # several polls
        reply = await router.Route(router_pb2.RouteRequest(query=FACT, strategy=LEARNED))
        assert reply.router_version == "router-v1"  # the broken one is logged and skipped


async def _wait_for_version(router, version: str) -> router_pb2.RouteResponse:
    for _ in range(100):
        with contextlib.suppress(grpc.aio.AioRpcError):
            reply = await router.Route(router_pb2.RouteRequest(query=FACT, strategy=LEARNED))
            if reply.router_version == version:
                return reply
        await asyncio.sleep(0.05)
    raise AssertionError(f"{version} was never served")


async def test_publishing_an_older_router_again_rolls_back_to_it(store):
    settings, stub = store
    for version in ("router-v1", "router-v2"):
        await train(settings, version)
    await publish(stub, "router-v1")
    await publish(stub, "router-v2")
    async with router_service(settings) as router:
        assert (await router.Route(router_pb2.RouteRequest(query=BIG, strategy=LEARNED))).router_version == "router-v2"
        await publish(stub, "router-v1")  # registered first, published last: the one served
        for _ in range(100):
            served = (await router.Route(router_pb2.RouteRequest(query=BIG, strategy=LEARNED))).router_version
            if served == "router-v1":
                break
            await asyncio.sleep(0.05)
    assert served == "router-v1"
