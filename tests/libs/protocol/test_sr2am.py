"""SR2AM plan blocks: new plans, continue, act, and sloppy variants."""

from __future__ import annotations

from gearshift.api.common.v1.common_pb2 import PlanDecision
from gearshift.protocol.sr2am import parse_plan_block, render_plan

FULL = """Let me think about this.
Plan:
- Current State: need 17*23; nothing computed yet
- Action: run python print(17*23)
- Expected Outcome: the product, 391
- Next Action: answer with the product
- Expected Outcome: the task is done
<tool_call>
{'id': 1, 'name': 'python', 'arguments': {'code': 'print(17*23)'}}
"""


def test_full_plan_has_depth_two_and_chained_states():
    parsed = parse_plan_block(FULL)
    assert parsed.decision == PlanDecision.PLAN_DECISION_PLAN_NEW
    steps = parsed.plan.steps
    assert len(steps) == 2
    assert steps[0].state == "need 17*23; nothing computed yet"
    assert steps[0].action == "run python print(17*23)"
    assert steps[1].state == "the product, 391"  # the predicted state carries over
    assert steps[1].expected_outcome == "the task is done"


def test_plan_none_means_act():
    assert parse_plan_block("Plan: None\n<answer>4</answer>").decision == PlanDecision.PLAN_DECISION_ACT
    assert parse_plan_block("Plan: none.").decision == PlanDecision.PLAN_DECISION_ACT


def test_empty_plan_means_continue():
    assert parse_plan_block("Plan:\n<tool_call>").decision == PlanDecision.PLAN_DECISION_CONTINUE


def test_no_block():
    assert parse_plan_block("just an answer") is None


def test_sloppy_case_and_bullets():
    assert parse_plan_block("plan: \n* action: y") is None  # the block marker is case-sensitive
    parsed = parse_plan_block("Plan:\n* current state: x\n* ACTION: y\n* expected outcome: z")
    assert [(s.state, s.action, s.expected_outcome) for s in parsed.plan.steps] == [("x", "y", "z")]


def test_render_round_trips():
    plan = parse_plan_block(FULL).plan
    again = parse_plan_block(render_plan(plan)).plan
    assert again == plan
    assert render_plan(type(plan)()) == "Plan: None"
