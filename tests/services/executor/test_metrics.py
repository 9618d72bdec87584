"""The executor's episode metrics, read from a finished trajectory as _finish stores it."""

from __future__ import annotations

from gearshift.api.common.v1.common_pb2 import (
    Cost,
    Mode,
    RoutingStrategy,
    TokenUsage,
    ToolCall,
    ToolResult,
    Trajectory,
    TrajectoryStatus,
    Turn,
)
from gearshift.protocol.a2fm import REJECTED_CALL_PREFIX
from gearshift.services.executor import metrics
from prometheus_client import REGISTRY


def sample(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_finished_episode_is_counted_by_mode_strategy_status_tokens_cost_and_tool_outcome():
    turn = Turn(
        tool_calls=[ToolCall(id="1", name="python"), ToolCall(id="2", name="web_search")],
        tool_results=[ToolResult(call_id="1", name="python", output="42"), ToolResult(call_id="2", name="web_search", is_error=True, error="down"),
                      ToolResult(call_id=f"{REJECTED_CALL_PREFIX}1", is_error=True, error="did not parse")],
    )
    trajectory = Trajectory(
        mode=Mode.MODE_AGENTIC, routing_strategy=RoutingStrategy.ROUTING_STRATEGY_LEARNED, status=TrajectoryStatus.TRAJECTORY_STATUS_FAILED,
        usage=TokenUsage(input_tokens=100, output_tokens=30), cost=Cost(total_usd=0.25), wall_seconds=3.0, turns=[turn],
    )
    before = {
        "episodes": sample("gearshift_executor_episodes_total", mode="agentic", strategy="learned", status="failed"),
        "seconds": sample("gearshift_executor_episode_seconds_sum", mode="agentic"),
        "input": sample("gearshift_executor_tokens_total", mode="agentic", kind="input"),
        "output": sample("gearshift_executor_tokens_total", mode="agentic", kind="output"),
        "cost": sample("gearshift_executor_cost_usd_total", mode="agentic"),
        "ok": sample("gearshift_executor_tool_calls_total", tool="python", outcome="ok"),
        "error": sample("gearshift_executor_tool_calls_total", tool="web_search", outcome="error"),
        "refused": sample("gearshift_executor_tool_calls_total", tool="none", outcome="refused"),
    }
    metrics.record_episode(trajectory)
    assert sample("gearshift_executor_episodes_total", mode="agentic", strategy="learned", status="failed") == before["episodes"] + 1
    assert sample("gearshift_executor_episode_seconds_sum", mode="agentic") == before["seconds"] + 3.0
    assert sample("gearshift_executor_tokens_total", mode="agentic", kind="input") == before["input"] + 100
    assert sample("gearshift_executor_tokens_total", mode="agentic", kind="output") == before["output"] + 30
    assert sample("gearshift_executor_cost_usd_total", mode="agentic") == before["cost"] + 0.25
    assert sample("gearshift_executor_tool_calls_total", tool="python", outcome="ok") == before["ok"] + 1
    assert sample("gearshift_executor_tool_calls_total", tool="web_search", outcome="error") == before["error"] + 1
    assert sample("gearshift_executor_tool_calls_total", tool="none", outcome="refused") == before["refused"] + 1


async def test_a_policy_stream_is_in_flight_until_it_ends():
    seen = []

    async def stream():
        for n in range(2):
            seen.append(sample("gearshift_executor_policy_calls_in_flight"))
            yield n

    before = sample("gearshift_executor_policy_calls_in_flight")
    assert [n async for n in metrics.awaiting_policy(stream())] == [0, 1]
    assert seen == [before + 1] * 2 and sample("gearshift_executor_policy_calls_in_flight") == before
