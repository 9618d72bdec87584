"""The router over real gRPC: model-native routing with re-asks and fallback, forced modes,
the learned-router extension point, and bad input. The policy is the ScriptedPolicy stand-in,
so each case of the model's behaviour is reproducible."""

from __future__ import annotations

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import Mode, RoutingStrategy, Sampling
from gearshift.api.router.v1 import router_pb2, router_pb2_grpc
from gearshift.clients import channel
from gearshift.server import running
from gearshift.services.router.service import build
from gearshift.settings import RouterSettings
from gearshift.testing.scripted_policy import serve_scripted


async def route(settings, respond, **request) -> router_pb2.RouteResponse:
    async with serve_scripted(respond) as url:
        configured = settings.with_policy(url).model_copy(update={"router": RouterSettings(max_attempts=3)})
        async with running(await build(configured), configured) as server, channel(f"127.0.0.1:{server.port}", configured) as ch:
            return await router_pb2_grpc.RouterStub(ch).Route(router_pb2.RouteRequest(**request))


async def test_the_policy_classifies_in_one_attempt(settings):
    reply = await route(settings, lambda body: "Needs arithmetic.\n<classification>\nreasoning_agent\n</classification>", query="17*23?")
    assert (reply.mode, reply.strategy, reply.attempts) == (Mode.MODE_REASONING, RoutingStrategy.ROUTING_STRATEGY_MODEL, 1)
    assert reply.rationale == "Needs arithmetic."
    assert reply.assistant_prefix == "Needs arithmetic.\n<classification>\nreasoning_agent\n</classification>\n<reasoning>"
    assert reply.usage.input_tokens > 0 and reply.usage.output_tokens > 0


async def test_a_reply_without_a_label_is_re_asked_with_the_block_prefilled(settings):
    seen: list[dict] = []

    def respond(body: dict) -> str:
        seen.append(body)
        return "toolcalling_agent" if body.get("continue_final_message") else "It is 391, I think."

    reply = await route(settings, respond, query="17*23?")
    assert reply.mode == Mode.MODE_AGENTIC and reply.attempts == 2
    assert seen[1]["messages"][-1] == {"role": "assistant", "content": "It is 391, I think.\n<classification>\n"}


async def test_after_max_attempts_the_fallback_mode_is_used(settings):
    reply = await route(settings, lambda body: "no idea", query="17*23?")
    assert reply.mode == Mode.MODE_INSTANT and reply.attempts == 3
    assert reply.strategy == RoutingStrategy.ROUTING_STRATEGY_FALLBACK  # not the model's choice: never trained as one
    assert "fell back to instant" in reply.rationale


async def test_sampling_reaches_the_classification_and_greedy_is_the_default(settings):
    seen: list[dict] = []

    def respond(body: dict) -> str:
        seen.append(body)
        return "Easy.\n<classification>\ndefault_agent\n</classification>"

    await route(settings, respond, query="hi")
    await route(settings, respond, query="hi", sampling=Sampling(temperature=1.0, top_p=0.9))
    assert [(body["temperature"], body["top_p"]) for body in seen] == [(0.0, 1.0), (1.0, 0.9)]


async def test_forced_mode_needs_no_policy(settings):
    reply = await route(settings, lambda body: pytest.fail("the policy was asked"), query="hi", forced_mode=Mode.MODE_AGENTIC)
    assert reply.mode == Mode.MODE_AGENTIC and reply.strategy == RoutingStrategy.ROUTING_STRATEGY_FORCED
    assert reply.assistant_prefix.endswith("<classification>\ntoolcalling_agent\n</classification>\n")


@pytest.mark.parametrize(
    ("request_fields", "code"),
    [
        ({"query": ""}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"query": "x" * 40_000}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"query": "hi", "forced_mode": 7}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"query": "hi", "strategy": 9}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"query": "hi", "strategy": RoutingStrategy.ROUTING_STRATEGY_FORCED}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"query": "hi", "strategy": RoutingStrategy.ROUTING_STRATEGY_LEARNED}, grpc.StatusCode.FAILED_PRECONDITION),
    ],
)
async def test_bad_requests(settings, request_fields, code):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await route(settings, lambda body: "", **request_fields)
    assert err.value.code() == code
