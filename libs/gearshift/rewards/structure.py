"""SR2AM structure validity: every agentic turn carries one plan block that parses
(docs/protocol.md, section 4).

    Plan:
    - Current State: ...
    - Action: ...
    - Expected Outcome: ...
    - Next Action: ...
    - Expected Outcome: ...

"Plan: None" acts without planning; "Plan:" followed by an empty line, an action tag or the end
continues the previous plan. Unlike gearshift.protocol.sr2am, which reads whatever the model
wrote so the episode can go on, this module is strict: it decides the SR2AM reward.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gearshift.api.common.v1.common_pb2 import Plan, PlanDecision, PlanStep, Turn
from gearshift.rewards.formats import FormatCheck

_HEADER = re.compile(r"^[ \t]*Plan:[ \t]*(.*)$", re.M)
_FIELD = re.compile(r"^[ \t]*[-*]?[ \t]*(Current State|Next Action|Action|Expected Outcome)[ \t]*:[ \t]*(.*)$", re.I)
_CONTINUATION = re.compile(r"^[ \t]{2,}[^-*\s]")


@dataclass(frozen=True)
class PlanBlock:
    """One parsed plan block and the configurator decision it expresses."""

    decision: int  # PlanDecision
    plan: Plan


class StructureError(ValueError):
    """A plan block that does not parse."""


def parse_plan_blocks(text: str) -> list[PlanBlock]:
    """Every plan block in one turn's output, in order; raises StructureError on a bad one."""
    headers = list(_HEADER.finditer(text))
    blocks = []
    for index, header in enumerate(headers):
        end = headers[index + 1].start() if index + 1 < len(headers) else len(text)
        blocks.append(_parse_block(header.group(1).strip(), text[header.end() : end]))
    return blocks


def _parse_block(inline: str, body: str) -> PlanBlock:
    if inline.lower().rstrip(".") == "none":
        return PlanBlock(PlanDecision.PLAN_DECISION_ACT, Plan())
    if inline:
        raise StructureError(f"unexpected text after 'Plan:': {inline[:60]!r}")
    lines = body.splitlines()[1:]  # body starts with the header line's own line break
    if not lines or not lines[0].strip() or lines[0].lstrip().startswith("<"):
        return PlanBlock(PlanDecision.PLAN_DECISION_CONTINUE, Plan())
    fields = _fields(lines)
    if not fields:
        raise StructureError(f"'Plan:' is followed by neither None, plan lines nor an empty line: {lines[0][:60]!r}")
    return PlanBlock(PlanDecision.PLAN_DECISION_PLAN_NEW, _steps(fields))


def _fields(lines: list[str]) -> list[tuple[str, str]]:
    """Leading (key, value) lines; indented lines continue the previous value."""
    fields: list[tuple[str, str]] = []
    for line in lines:
        match = _FIELD.match(line)
        if match:
            fields.append((match.group(1).lower(), match.group(2).strip()))
        elif fields and _CONTINUATION.match(line):
            key, value = fields[-1]
            fields[-1] = (key, f"{value} {line.strip()}".strip())
        else:
            break
    return fields


def _steps(fields: list[tuple[str, str]]) -> Plan:
    if fields[0][0] != "current state":
        raise StructureError("a plan starts with 'Current State:'")
    steps: list[PlanStep] = []
    state, pending = "", None
    for key, value in fields:
        if not value:
            raise StructureError(f"empty '{key}'")
        if key == "current state":
            if pending is not None:
                raise StructureError("'Current State' between an action and its expected outcome")
            state = value
        elif key in ("action", "next action"):
            if pending is not None:
                raise StructureError("an action without an expected outcome")
            pending = PlanStep(state=state, action=value)
        elif pending is None:
            raise StructureError("an expected outcome without an action")
        else:
            pending.expected_outcome = value
            steps.append(pending)
            state, pending = value, None
    if pending is not None:
        raise StructureError("the last action has no expected outcome")
    if not steps:
        raise StructureError("a plan needs at least one action and expected outcome")
    return Plan(steps=steps)


def check_structure(turns: Sequence[Turn]) -> FormatCheck:
    """Whether every regulated agentic turn (one with a configurator decision) has exactly one
    plan block that parses, matching the recorded decision, and continues only a plan that was
    written before. Turns nobody regulated (instant and reasoning mode, an agentic episode's
    forced-answer turn) have no plan block to check."""
    planned = False
    for position, turn in enumerate(turns):
        if turn.plan_decision == PlanDecision.PLAN_DECISION_UNSPECIFIED:
            continue
        try:
            blocks = parse_plan_blocks(turn.output)
        except StructureError as exc:
            return FormatCheck(False, f"turn {position}: {exc}")
        if len(blocks) != 1:
            return FormatCheck(False, f"turn {position} has {len(blocks)} plan blocks (needs one)")
        decision = blocks[0].decision
        if turn.plan_decision != decision:
            return FormatCheck(False, f"turn {position}: the plan block contradicts the recorded decision")
        if decision == PlanDecision.PLAN_DECISION_CONTINUE and not planned:
            return FormatCheck(False, f"turn {position} continues a plan that was never written")
        planned = planned or decision == PlanDecision.PLAN_DECISION_PLAN_NEW
    return FormatCheck(True)
