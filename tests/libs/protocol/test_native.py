"""The native protocol's pieces without a server: the calls read from an engine's tool_calls,
the conversation rebuilt from a trajectory, and what counts as a well-formed native episode."""

from __future__ import annotations

import json

import pytest
from gearshift.api.common.v1.common_pb2 import (
    Mode,
    Plan,
    PlanDecision,
    PlanStep,
    PolicyProtocol,
    ToolCall,
    ToolResult,
    Trajectory,
    Turn,
)
from gearshift.policy_client import ToolCall as EngineCall
from gearshift.protocol import native
from gearshift.rewards.formats import check_trajectory_format
from gearshift.rewards.scoring import structure_of
from gearshift.protocol.sr2am import render_plan

KNOWN = frozenset({"python", "web_search"})


def engine_call(name: str, arguments, call_id: str = "") -> EngineCall:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return EngineCall.of({"id": call_id, "function": {"name": name, "arguments": raw}})


def test_calls_keep_their_order_and_ids_and_refusals_say_why():
    read = native.read_calls([
        engine_call("python", {"code": "1"}, "a"), engine_call("python", {"code": "2"}, "a"),  # a repeated id
        engine_call("nope", {}), engine_call("python", "{'code': 1"), engine_call("python", "[1]"),
    ], KNOWN)
    assert [item.call.id for item in read] == ["a", "call_2", "call_3", "call_4", "call_5"]
    assert [item.refusal is None for item in read] == [True, True, False, False, False]
    assert read[2].refusal == "Unknown tool 'nope'; available: python, web_search."
    assert read[3].refusal == "The arguments of python are not a JSON object: {'code': 1"
    assert read[3].call.arguments_json == read[4].call.arguments_json == "{}"  # sent back as an object
    assert read[0].call.arguments_json == '{"code": "1"}'  # verbatim when it parses
    assert native.refused(native.refusal_result(read[2])) and not native.refused(ToolResult(call_id="a", name="python", is_error=True))


def test_more_calls_than_allowed_are_refused_past_the_limit():
    read = native.read_calls([engine_call("python", {"code": str(n)}) for n in range(12)], KNOWN)
    assert [item.refusal is not None for item in read] == [False] * 10 + [True, True]


def test_engine_arguments_sent_as_an_object_are_kept_as_json():
    (item,) = native.read_calls([EngineCall.of({"id": "x", "function": {"name": "python", "arguments": {"code": "1"}}})], KNOWN)
    assert item.refusal is None and json.loads(item.call.arguments_json) == {"code": "1"}


PLAN = Plan(steps=[PlanStep(state="need 17*23", action="run python", expected_outcome="the product")])


def agentic(*turns: Turn) -> Trajectory:
    return Trajectory(query="What is 17*23?", mode=Mode.MODE_AGENTIC, protocol=PolicyProtocol.POLICY_PROTOCOL_NATIVE, turns=turns)


def calling(*results: ToolResult, decision=PlanDecision.PLAN_DECISION_PLAN_NEW) -> Turn:
    calls = [ToolCall(id=r.call_id, name=r.name or "nope", arguments_json="{}") for r in results]
    return Turn(index=0, plan_decision=decision, plan=PLAN if decision == PlanDecision.PLAN_DECISION_PLAN_NEW else Plan(),
                tool_calls=calls, tool_results=results)


ANSWER = Turn(index=1, output="391", plan_decision=PlanDecision.PLAN_DECISION_CONTINUE)


def test_the_conversation_puts_each_plan_before_its_turns_generation():
    trajectory = agentic(calling(ToolResult(call_id="c1", name="python", output="391\n")), ANSWER)
    chat = native.messages(trajectory)
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "assistant", "tool", "assistant", "assistant"]
    # Each regulated turn opens with its SR2AM block as the text protocol's transcript holds it.
    assert chat[2]["content"] == render_plan(PLAN) + "\n<plan>" and "tool_calls" in chat[3]
    assert chat[4] == {"role": "tool", "tool_call_id": "c1", "content": "391"}
    assert chat[5]["content"] == "\nPlan:\n\n"  # continue the plan
    assert [m.generated_by is not None for m in native.episode(trajectory)] == [False, False, False, True, False, False, True]
    acting = Turn(index=0, plan_decision=PlanDecision.PLAN_DECISION_ACT)
    assert native.opening_message(acting)["content"] == "Plan: None\n<plan>"
    assert native.opening_message(Turn(index=0)) is None  # instant and reasoning turns are not regulated
    upcoming = Turn(index=0, plan_decision=PlanDecision.PLAN_DECISION_PLAN_NEW, plan=PLAN)
    assert native.messages(agentic(), upcoming)[-1]["content"] == chat[2]["content"]
    assert native.template_messages(chat)[3]["tool_calls"][0]["function"]["arguments"] == {}


@pytest.mark.parametrize(("trajectory", "reason"), [
    (agentic(calling(ToolResult(call_id="c1", name="python", output="391")), ANSWER), ""),
    (agentic(calling(ToolResult(call_id="c1", name="python", is_error=True, error="boom")), ANSWER), ""),  # a tool's own failure
    (agentic(calling(native.refusal_result(native.ReadCall(ToolCall(id="c1"), "Unknown tool"))), ANSWER), "Unknown tool"),
    (agentic(Turn(index=0, output="thinking aloud"), ANSWER), "neither calls a tool"),
    (agentic(calling(ToolResult(call_id="c1", name="python", output="391"))), "does not end with an answer"),
    (Trajectory(mode=Mode.MODE_INSTANT, protocol=PolicyProtocol.POLICY_PROTOCOL_NATIVE, turns=[Turn(output="42")]), ""),
    (Trajectory(mode=Mode.MODE_INSTANT, protocol=PolicyProtocol.POLICY_PROTOCOL_NATIVE,
                turns=[Turn(output="42", reasoning_content="hmm")]), "without reasoning"),
    (Trajectory(mode=Mode.MODE_REASONING, protocol=PolicyProtocol.POLICY_PROTOCOL_NATIVE,
                turns=[Turn(output="391", reasoning_content="17*23 = 391")]), ""),
    (Trajectory(mode=Mode.MODE_REASONING, protocol=PolicyProtocol.POLICY_PROTOCOL_NATIVE, turns=[Turn(output="391")]),
     "reasons before it answers"),
    (Trajectory(mode=Mode.MODE_REASONING, protocol=PolicyProtocol.POLICY_PROTOCOL_NATIVE, turns=[Turn(output="")]),
     "does not end with an answer"),
])
def test_a_native_episode_is_well_formed(trajectory, reason):
    verdict = check_trajectory_format(trajectory)
    assert verdict.valid == (not reason) and reason in verdict.reason


def test_sr2am_structure_of_a_native_episode_is_its_recorded_decisions():
    ran = ToolResult(call_id="c1", name="python", output="391")
    assert structure_of(agentic(calling(ran), ANSWER), format_valid=True)
    continued_first = agentic(calling(ran, decision=PlanDecision.PLAN_DECISION_CONTINUE), ANSWER)
    assert not structure_of(continued_first, format_valid=True)  # continues a plan never written
