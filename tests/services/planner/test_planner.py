"""The planner service over real gRPC, the policy a scripted stand-in: the configurator and the
planner continue the agent's own message after "Plan:" in both protocols' forms (the text
protocol's transcript as a continued assistant message; the native conversation rendered by the
engine's /tokenize and continued raw by /v1/completions), and bad belief states are refused."""

from __future__ import annotations

import contextlib
import json

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import NativeRequest, PlanDecision
from gearshift.api.planner.v1 import planner_pb2, planner_pb2_grpc
from gearshift.clients import channel
from gearshift.protocol import native
from gearshift.protocol.sr2am import PLAN_HEAD, PLAN_OPENER
from gearshift.server import running
from gearshift.services.planner.service import build
from gearshift.teaching.endpoint import stand_in_render
from gearshift.testing.scripted_policy import serve_scripted

QUERY = "What is 17*23?"
STEP = " need 17*23\n- Action: run python\n- Expected Outcome: the product"
TOOLS = [{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}]
CONVERSATION = [*native.prompt_messages(QUERY), {"role": "assistant", "content": ""}]


class Policy:
    """Plans anew after "Plan:", then writes one step; keeps every request body."""

    def __init__(self):
        self.bodies: list[dict] = []

    def __call__(self, body: dict) -> str:
        self.bodies.append(body)
        said = body.get("prompt") or body["messages"][-1]["content"]
        return STEP if said.endswith(PLAN_OPENER) else "\n- Current State:"


@contextlib.asynccontextmanager
async def planner(settings, policy):
    async with serve_scripted(policy) as url:
        configured = settings.with_policy(url)
        async with running(await build(configured), configured) as server, channel(f"127.0.0.1:{server.port}", configured) as ch:
            yield planner_pb2_grpc.PlannerStub(ch)


NATIVE = planner_pb2.BeliefState(query=QUERY, native_messages_json=json.dumps(CONVERSATION),
                                 native=NativeRequest(tools_json=json.dumps(TOOLS), chat_template_kwargs_json='{"enable_thinking": true}'))
TEXT = planner_pb2.BeliefState(query=QUERY, transcript="<classification>\ntoolcalling_agent\n</classification>\n")


@pytest.mark.parametrize("belief", [NATIVE, TEXT], ids=["native", "text"])
async def test_decisions_and_plans_continue_the_agents_own_message(settings, belief):
    policy = Policy()
    async with planner(settings, policy) as stub:
        decided = await stub.Regulate(planner_pb2.RegulateRequest(state=belief))
        planned = await stub.Plan(planner_pb2.PlanRequest(state=belief))
    assert decided.decision == PlanDecision.PLAN_DECISION_PLAN_NEW and decided.rationale == "policy chose PLAN_DECISION_PLAN_NEW"
    assert [(s.state, s.action, s.expected_outcome) for s in planned.plan.steps] == [("need 17*23", "run python", "the product")]
    regulate, plan = policy.bodies
    if belief is NATIVE:  # the conversation as the engine renders it, continued as sampled
        opened = [*CONVERSATION[:-1], {"role": "assistant", "content": PLAN_HEAD}]
        assert regulate["prompt"] == stand_in_render({"messages": opened, "continue_final_message": True})
        assert plan["prompt"].endswith("<|im_start|>assistant\n" + PLAN_OPENER)
    else:
        assert regulate["messages"][-1] == {"role": "assistant", "content": belief.transcript + PLAN_HEAD}
        assert regulate["continue_final_message"] and plan["messages"][-1]["content"] == belief.transcript + PLAN_OPENER
    assert decided.sampled.token_ids and planned.sampled.token_ids  # what the policy sampled of its own block


@pytest.mark.parametrize(("messages", "says"), [
    ("not json", "not JSON"),
    (json.dumps({"role": "assistant"}), "a list of chat messages"),
    (json.dumps([{"content": "no role"}]), "a list of chat messages"),
    (json.dumps(native.prompt_messages(QUERY)), "end with the assistant message"),
    (json.dumps([{"role": "assistant", "content": "x" * 300_000}]), "longer than"),
])
async def test_a_bad_native_conversation_is_refused(settings, messages, says):
    async with planner(settings, Policy()) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Regulate(planner_pb2.RegulateRequest(state=planner_pb2.BeliefState(query=QUERY, native_messages_json=messages)))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in refused.value.details()
