"""Rollout builders shared by the reward tests: well-formed outputs for each mode."""

from __future__ import annotations

from gearshift.api.common.v1.common_pb2 import Mode, PlanDecision, RoutingStrategy, TokenUsage, ToolResult, Trajectory, Turn

INSTANT, REASONING, AGENTIC = Mode.MODE_INSTANT, Mode.MODE_REASONING, Mode.MODE_AGENTIC
FORCED, MODEL = RoutingStrategy.ROUTING_STRATEGY_FORCED, RoutingStrategy.ROUTING_STRATEGY_MODEL

AGENTIC_TURNS = (
    "<plan>\nGoal 1: find 17*23. Path 1: python. Success: a number.\n</plan>\n"
    "I will compute it.\n<tool_call>\n{'id': 1, 'name': 'python', 'arguments': {'code': 'print(17*23)'}}\n</tool_call>",
    "The tool says 391.\n<answer>391</answer>",
)

SR2AM_TURNS = (
    "Let me plan.\nPlan:\n- Current State: need 17*23, nothing derived\n- Action: run python\n"
    "- Expected Outcome: the product is printed\n<tool_call>\n{'id': 1, 'name': 'python', 'arguments': {'code': 'print(17*23)'}}\n</tool_call>",
    "The tool printed 391.\nPlan: None\n<answer>391</answer>",
)


def regulated(text: str) -> int:
    """The configurator decision the executor records for an agentic turn: the one its plan
    block expresses, ACT when it has none (the block is then missing)."""
    if "Plan:\n-" in text:
        return PlanDecision.PLAN_DECISION_PLAN_NEW
    if "Plan:\n\n" in text:
        return PlanDecision.PLAN_DECISION_CONTINUE
    return PlanDecision.PLAN_DECISION_ACT


def output_for(mode: int, answer: str) -> tuple[str, ...]:
    """Turn outputs that follow the mode's A^2FM format, as the executor stores them: after the
    routing prefix and mode opener (<answer>, <reasoning>) it injected."""
    if mode == INSTANT:
        return (f"{answer}</answer>",)
    if mode == REASONING:
        return (f"Work it out step by step.</reasoning>\n<answer>{answer}</answer>",)
    return (AGENTIC_TURNS[0], f"The tool says so.\n<answer>{answer}</answer>")


def rollout(
    mode: int = INSTANT,
    answer: str = "391",
    *,
    forced: bool = False,
    outputs: tuple[str, ...] | None = None,
    well_formed: bool = True,
    ident: str = "t",
) -> Trajectory:
    """A rollout in mode; forced ones carry requested_mode and strategy FORCED as APO makes them."""
    outputs = outputs if outputs is not None else output_for(mode, answer)
    if not well_formed:
        outputs = (f"</reasoning>Sure! {answer}",)  # a closing tag that was never opened
    turns = [
        Turn(index=i, output=text, usage=TokenUsage(input_tokens=100, output_tokens=50),
             plan_decision=regulated(text) if mode == AGENTIC else PlanDecision.PLAN_DECISION_UNSPECIFIED)
        for i, text in enumerate(outputs)
    ]
    return Trajectory(
        id=ident,
        query="What is 17*23?",
        mode=mode,
        requested_mode=mode if forced else Mode.MODE_UNSPECIFIED,
        routing_strategy=FORCED if forced else MODEL,
        turns=turns,
        answer=answer,
    )


def with_tool_results(trajectory: Trajectory, *results: tuple[str, float]) -> Trajectory:
    """Adds executed tool calls (name, CPU seconds) to the first turn."""
    for number, (name, cpu) in enumerate(results, start=1):
        trajectory.turns[0].tool_results.append(ToolResult(call_id=str(number), name=name, cpu_seconds=cpu))
    return trajectory
