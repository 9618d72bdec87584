"""SR2AM plan blocks: strict parsing and per-trajectory structure validity."""

from __future__ import annotations

import pytest
from gearshift.api.common.v1.common_pb2 import PlanDecision, Turn
from gearshift.rewards.structure import StructureError, check_structure, parse_plan_blocks

from tests.libs.rewards.trajectories import SR2AM_TURNS

NEW, CONTINUE, ACT = PlanDecision.PLAN_DECISION_PLAN_NEW, PlanDecision.PLAN_DECISION_CONTINUE, PlanDecision.PLAN_DECISION_ACT
UNREGULATED = PlanDecision.PLAN_DECISION_UNSPECIFIED

TWO_STEP = """Thinking about it.
Plan:
- Current State: goal: 17*23; nothing derived
- Action: run python on 17*23
- Expected Outcome: 391 printed
- Next Action: answer 391
- Expected Outcome: done
<tool_call>"""


def test_a_two_step_plan():
    (block,) = parse_plan_blocks(TWO_STEP)
    assert block.decision == NEW
    steps = [(s.state, s.action, s.expected_outcome) for s in block.plan.steps]
    assert steps == [
        ("goal: 17*23; nothing derived", "run python on 17*23", "391 printed"),
        ("391 printed", "answer 391", "done"),  # the next step starts from the predicted state
    ]


@pytest.mark.parametrize(
    ("text", "decision"),
    [
        ("Plan: None\n<tool_call>", ACT),
        ("Plan: none.", ACT),
        ("Plan:\n\nI keep going.", CONTINUE),
        ("Plan:\n<answer>3</answer>", CONTINUE),
        ("Plan:", CONTINUE),
        ("Plan:\n* current state: s\n* action: a\n* expected outcome: o\nNow acting.", NEW),
        ("Plan:\n- Current State: s\n- Action: a long action\n    that wraps\n- Expected Outcome: o", NEW),
    ],
)
def test_block_kinds(text, decision):
    (block,) = parse_plan_blocks(text)
    assert block.decision == decision


@pytest.mark.parametrize(
    "text",
    [
        "Plan: go left",  # text after the header
        "Plan:\nI will think about it",  # neither None, plan lines nor an empty line
        "Plan:\n- Action: a\n- Expected Outcome: o",  # no current state
        "Plan:\n- Current State: s\n- Action: a",  # no expected outcome
        "Plan:\n- Current State: s",  # no action
        "Plan:\n- Current State: s\n- Expected Outcome: o",  # outcome without action
        "Plan:\n- Current State: s\n- Action: a\n- Action: b\n- Expected Outcome: o",
        "Plan:\n- Current State: s\n- Action:\n- Expected Outcome: o",  # empty value
    ],
)
def test_blocks_that_do_not_parse(text):
    with pytest.raises(StructureError):
        parse_plan_blocks(text)


def test_only_line_start_headers_count():
    assert parse_plan_blocks("My Plan: none of this matters") == []


@pytest.mark.parametrize(
    ("outputs", "decisions", "valid"),
    [
        (list(SR2AM_TURNS), [NEW, ACT], True),
        (list(SR2AM_TURNS), [ACT, ACT], False),  # the block contradicts the recorded decision
        ([SR2AM_TURNS[0], "Plan:\n\nstill on it <answer>391</answer>"], [NEW, CONTINUE], True),  # continue a written plan
        (["Plan:\n\n<answer>391</answer>"], [CONTINUE], False),  # continue with nothing to continue
        ([SR2AM_TURNS[0], "<answer>391</answer>"], [NEW, ACT], False),  # a regulated turn without a plan block
        ([SR2AM_TURNS[0], "\n<answer>391</answer>"], [NEW, UNREGULATED], True),  # the forced-answer turn has none to check
        (["Plan: None\nPlan: None\n<answer>1</answer>"], [ACT], False),  # two blocks in one turn
        (["Plan:\n- Current State: s\n- Action: a\n<answer>1</answer>"], [NEW], False),
        ([], [], True),  # nothing regulated, nothing to check (instant and reasoning mode)
    ],
)
def test_structure(outputs, decisions, valid):
    turns = [Turn(index=i, output=o, plan_decision=d) for i, (o, d) in enumerate(zip(outputs, decisions))]
    check = check_structure(turns)
    assert check.valid is valid, check.reason
