"""What the CLI shows a person: the live view of an episode and stored trajectories."""

from __future__ import annotations

import json

from google.protobuf.json_format import MessageToDict
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gearshift.api.common.v1.common_pb2 import Mode, PlanDecision, RoutingStrategy, Trajectory, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.clients import service_channel
from gearshift.protocol.modes import MODE_OF, mode_name
from gearshift.settings import Settings

MODE_BY_NAME = MODE_OF | {"auto": Mode.MODE_UNSPECIFIED}  # what `gearshift solve --mode` accepts


def status_name(status: int) -> str:
    return TrajectoryStatus.Name(status).removeprefix("TRAJECTORY_STATUS_").lower()


def as_json(trajectory: Trajectory) -> str:
    return json.dumps(MessageToDict(trajectory, preserving_proto_field_name=True), indent=2)


class LiveView:
    """Prints an episode's events as they stream in."""

    def __init__(self, console: Console):
        self.console = console
        self.in_text = False

    def show(self, item: executor_pb2.SolveEvent) -> None:
        kind = item.WhichOneof("event")
        if kind != "chunk" and self.in_text:
            self.console.print()
            self.in_text = False
        if kind == "mode_chosen":
            strategy = RoutingStrategy.Name(item.mode_chosen.strategy).removeprefix("ROUTING_STRATEGY_").lower()
            self.console.print(f"[bold]mode[/] {mode_name(item.mode_chosen.mode)} ({strategy}): {item.mode_chosen.rationale}")
        elif kind == "plan":
            decision = PlanDecision.Name(item.plan.decision).removeprefix("PLAN_DECISION_").lower()
            steps = "; ".join(step.action for step in item.plan.plan.steps)
            self.console.print(f"[bold cyan]turn {item.turn} plan[/] {decision}" + (f": {steps}" if steps else ""))
        elif kind == "chunk":
            self.console.print(item.chunk.text, end="", style="dim", markup=False, highlight=False)
            self.in_text = True
        elif kind == "tool_call":
            self.console.print(f"[bold yellow]call {item.tool_call.id}[/] {item.tool_call.name} {item.tool_call.arguments_json}", markup=True)
        elif kind == "tool_result":
            result = item.tool_result
            text = f"error: {result.error}" if result.is_error else result.output.strip()
            self.console.print(f"[bold yellow]result {result.call_id}[/] {text[:300]}")
        # The answer is in the streamed text already; summary() states it once more with its verdict.


def summary(trajectory: Trajectory) -> Text:
    """The episode's outcome and figures as a few short lines that wrap cleanly at 80 columns."""
    calls = sum(len(turn.tool_calls) for turn in trajectory.turns)
    verdict = ""
    if trajectory.HasField("reward"):
        verdict = " (correct)" if trajectory.reward.correct else " (wrong)"
    line = Text()
    line.append("answer ", style="bold green").append(trajectory.answer or "none").append(verdict, style="bold")
    line.append(f"\n{mode_name(trajectory.mode, unset='?')} mode, {status_name(trajectory.status)}, "
                f"{len(trajectory.turns)} turn{'s' if len(trajectory.turns) != 1 else ''}, {calls} tool call{'s' if calls != 1 else ''}, "
                f"{trajectory.usage.input_tokens} + {trajectory.usage.output_tokens} tokens, "
                f"${trajectory.cost.total_usd:.6f}, {trajectory.wall_seconds:.1f} s", style="dim")
    return line


def trajectories_table(trajectories: list[Trajectory]) -> Table:
    table = Table(show_header=True, header_style="bold")
    for column in ("id", "created", "mode", "status", "correct", "cost $", "query"):
        table.add_column(column, overflow="ellipsis", no_wrap=column != "query")
    for t in trajectories:
        correct = ("yes" if t.reward.correct else "no") if t.HasField("reward") else "-"
        created = t.created_at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(t.id, created, mode_name(t.mode, unset="?"), status_name(t.status), correct, f"{t.cost.total_usd:.6f}", t.query[:80])
    return table


async def solve(settings: Settings, request: executor_pb2.SolveRequest, live: LiveView | None) -> Trajectory:
    """Streams one Solve through the executor, showing events live; returns the stored trajectory."""
    async with service_channel("executor", settings) as channel:
        async for item in executor_pb2_grpc.ExecutorStub(channel).Solve(request):
            if live:
                live.show(item)
            if item.WhichOneof("event") == "final":
                return item.final.trajectory
    raise RuntimeError("the executor closed the stream without a final event")
