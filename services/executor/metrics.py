"""The executor's Prometheus metrics: what its episodes did, read from each finished trajectory
once the store has it (one place records them all, so a count and the stored trajectory never
disagree), what it is waiting on now (episodes in flight, policy generations), and its spool of
trajectories waiting for the store (spool.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TypeVar

from prometheus_client import Counter, Gauge, Histogram

from gearshift.api.common.v1.common_pb2 import Mode, RoutingStrategy, Trajectory, TrajectoryStatus
from gearshift.protocol.native import refused

T = TypeVar("T")

EPISODE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
NO_TOOL = "none"  # the tool label of a call the platform refused: no tool ran (and a model's made-up names stay out)

# What the executor's load is (it waits on the policy, so its CPU says little): autoscaling reads it.
EPISODES_IN_FLIGHT = Gauge("gearshift_executor_episodes_in_flight", "Episodes (Solve streams) running")
POLICY_CALLS_IN_FLIGHT = Gauge("gearshift_executor_policy_calls_in_flight", "Generations the executor is waiting on the policy for")
EPISODES = Counter("gearshift_executor_episodes", "Episodes finished, by mode, routing strategy and status", ["mode", "strategy", "status"])
EPISODE_SECONDS = Histogram("gearshift_executor_episode_seconds", "Wall-clock seconds of a finished episode", ["mode"],
                            buckets=EPISODE_BUCKETS)
TOKENS = Counter("gearshift_executor_tokens", "Policy tokens of finished episodes (a judge's included), by kind", ["mode", "kind"])
COST = Counter("gearshift_executor_cost_usd", "Priced cost of finished episodes in US dollars", ["mode"])
SPOOL_DEPTH = Gauge("gearshift_executor_spool_depth", "Finished trajectories in the executor's spool, waiting for the store to take them")
SPOOL_TRAJECTORIES = Counter(
    "gearshift_executor_spool_trajectories",
    "Trajectories through the spool, by event: spooled (the store did not take it), replayed (the store took it from the spool), "
    "refused (the store refused it as invalid: set aside in the spool's refused/)", ["event"],
)
TOOL_CALLS = Counter("gearshift_executor_tool_calls", "Tool calls of finished episodes, by tool and outcome (ok, error, refused)",
                     ["tool", "outcome"])


def label(enum, value: int, prefix: str) -> str:
    """A protobuf enum value as a label: MODE_AGENTIC -> agentic."""
    return enum.Name(value).removeprefix(prefix).lower()


def record_episode(trajectory: Trajectory) -> None:
    """Counts one finished episode (whatever its status) once the store has its trajectory."""
    mode = label(Mode, trajectory.mode, "MODE_")
    strategy = label(RoutingStrategy, trajectory.routing_strategy, "ROUTING_STRATEGY_")
    EPISODES.labels(mode, strategy, label(TrajectoryStatus, trajectory.status, "TRAJECTORY_STATUS_")).inc()
    EPISODE_SECONDS.labels(mode).observe(trajectory.wall_seconds)
    TOKENS.labels(mode, "input").inc(trajectory.usage.input_tokens)
    TOKENS.labels(mode, "output").inc(trajectory.usage.output_tokens)
    COST.labels(mode).inc(max(trajectory.cost.total_usd, 0.0))
    for turn in trajectory.turns:
        names = {call.id: call.name for call in turn.tool_calls}
        for result in turn.tool_results:
            if refused(result):
                TOOL_CALLS.labels(NO_TOOL, "refused").inc()
            else:
                TOOL_CALLS.labels(names.get(result.call_id) or result.name, "error" if result.is_error else "ok").inc()


async def awaiting_policy(stream: AsyncIterator[T]) -> AsyncIterator[T]:
    """Passes a policy stream on, counted in POLICY_CALLS_IN_FLIGHT until it ends."""
    POLICY_CALLS_IN_FLIGHT.inc()
    try:
        async for item in stream:
            yield item
    finally:
        POLICY_CALLS_IN_FLIGHT.dec()
