"""SR2AM plan blocks: "Plan:" followed by Current State / Action / Expected Outcome lines,
"Plan: None" (act without planning) or an empty "Plan:" (continue the previous plan)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gearshift.api.common.v1.common_pb2 import Plan, PlanDecision, PlanStep
from gearshift.protocol.prompts import AGENTIC_OPENER

_BLOCK = re.compile(r"^\s*Plan:[ \t]*(.*)$", re.M | re.S)
_FIELD = re.compile(r"^\s*[-*]?\s*(Current State|Next Action|Action|Expected Outcome)\s*:\s*(.*)$", re.I)


@dataclass
class ParsedPlan:
    decision: int  # PlanDecision
    plan: Plan


def parse_plan_block(text: str) -> ParsedPlan | None:
    """Parses the last "Plan:" block in text; None when there is none."""
    blocks = list(_BLOCK.finditer(text))
    if not blocks:
        return None
    body = blocks[-1].group(1)
    first_line = body.split("\n", 1)[0].strip()
    if first_line.lower().rstrip(".") == "none":
        return ParsedPlan(PlanDecision.PLAN_DECISION_ACT, Plan())
    steps: list[PlanStep] = []
    state = ""
    for line in body.splitlines():
        if line.lstrip().startswith("<"):
            break  # the action itself (a tool call or the answer) follows the plan
        match = _FIELD.match(line)
        if not match:
            continue
        key, value = match.group(1).lower(), match.group(2).strip()
        if key == "current state":
            state = value
        elif key in ("action", "next action"):
            steps.append(PlanStep(state=state, action=value))
        elif key == "expected outcome" and steps and not steps[-1].expected_outcome:
            steps[-1].expected_outcome = value
            state = value  # the next step starts from the predicted state
    if not steps:
        return ParsedPlan(PlanDecision.PLAN_DECISION_CONTINUE, Plan())
    return ParsedPlan(PlanDecision.PLAN_DECISION_PLAN_NEW, Plan(steps=steps))


def plan_block(decision: int, plan: Plan, first_turn: bool) -> tuple[str, str]:
    """The text the executor writes at the start of a regulated agentic turn: the SR2AM block
    for the configurator's decision (learned in training), and the <plan> opener it injects
    after the first turn's block (masked in training). Serving and training both read it here."""
    block = {
        PlanDecision.PLAN_DECISION_PLAN_NEW: render_plan(plan),
        PlanDecision.PLAN_DECISION_CONTINUE: "Plan:\n",  # an empty plan: "Plan:" then an empty line
        PlanDecision.PLAN_DECISION_ACT: "Plan: None",
    }[decision]
    return (f"{block}\n", AGENTIC_OPENER) if first_turn else (f"{plan_block_separator(first_turn)}{block}\n", "")


PLAN_HEAD = "Plan:"  # every regulated turn's block starts so; what follows is the decision
PLAN_OPENER = PLAN_HEAD + "\n- Current State:"  # the planner has the policy continue a new plan from here


def plan_block_separator(first_turn: bool) -> str:
    """What comes between the transcript and a turn's plan block (the planner plans from there)."""
    return "" if first_turn else "\n"


def render_plan(plan: Plan) -> str:
    """Writes a plan back in the SR2AM form (used in prompts and training targets)."""
    if not plan.steps:
        return "Plan: None"
    lines = ["Plan:", f"- Current State: {plan.steps[0].state}"]
    for index, step in enumerate(plan.steps):
        lines.append(f"- {'Action' if index == 0 else 'Next Action'}: {step.action}")
        lines.append(f"- Expected Outcome: {step.expected_outcome}")
    return "\n".join(lines)
