"""Literal trajectories for the training tests: one the model routed, one forced with a tool call."""

from gearshift.api.common.v1.common_pb2 import (
    Mode,
    PlanDecision,
    Reward,
    RoutingStrategy,
    ToolResult,
    Trajectory,
    TrajectoryStatus,
    Turn,
)

TOOL_CALL = "<tool_call>\n{'id': 1, 'name': 'python', 'arguments': {'code': 'print(17*23)'}}\n</tool_call>"


def routed_instant(trajectory_id="00000000-0000-0000-0000-000000000001", difficulty="easy", correct=True) -> Trajectory:
    return Trajectory(
        id=trajectory_id,
        query="What is the capital of France?",
        mode=Mode.MODE_INSTANT,
        routing_strategy=RoutingStrategy.ROUTING_STRATEGY_MODEL,
        routing_rationale="A simple fact.",
        turns=[Turn(index=0, output="Paris</answer>")],
        answer="Paris",
        reference_answer="Paris",
        status=TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED,
        reward=Reward(value=1.0 if correct else 0.0, correct=correct, format_valid=True, kind="correctness"),
        task_source="unit",
        split="train",
        labels={"difficulty": difficulty, "domain": "qa"},
    )


def forced_agentic(trajectory_id="00000000-0000-0000-0000-000000000002", difficulty="hard") -> Trajectory:
    return Trajectory(
        id=trajectory_id,
        query="What is 17*23?",
        mode=Mode.MODE_AGENTIC,
        requested_mode=Mode.MODE_AGENTIC,
        routing_strategy=RoutingStrategy.ROUTING_STRATEGY_FORCED,
        routing_rationale="This question needs tools to answer reliably.",
        turns=[
            Turn(  # as the executor writes it: the <plan> opener after the first block is injected
                index=0,
                plan_decision=PlanDecision.PLAN_DECISION_ACT,
                output="Plan: None\n<plan>multiply</plan>\n" + TOOL_CALL,
                injected_spans=[11, 17],
                tool_results=[ToolResult(call_id="1", name="python", output="391\n")],
            ),
            Turn(index=1, plan_decision=PlanDecision.PLAN_DECISION_ACT, output="\nPlan: None\n<answer>391</answer>"),
        ],
        answer="391",
        reference_answer="391",
        status=TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED,
        reward=Reward(value=1.0, correct=True, format_valid=True, kind="correctness"),
        task_source="unit",
        split="train",
        labels={"difficulty": difficulty, "domain": "math"},
    )
