"""What the CLI shows a person: the live view of an episode and stored trajectories."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from google.protobuf.json_format import MessageToDict
from rich.console import Console
from rich.text import Text

from gearshift.api.common.v1.common_pb2 import Mode, PlanDecision, RoutingStrategy, ToolCall, ToolResult, Trajectory, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.clients import service_channel
from gearshift.protocol.a2fm import REJECTED_CALL_PREFIX
from gearshift.protocol.modes import MODE_OF, mode_name
from gearshift.protocol.parsers import a2fm as a2fm_format
from gearshift.protocol.parsers.tags import TAG, TagReader
from gearshift.protocol.prompts import MODE_OPENERS
from gearshift.protocol.sr2am import plan_block
from gearshift.settings import Settings
from gearshift.tables import Column, TableData

MODE_BY_NAME = MODE_OF | {"auto": Mode.MODE_UNSPECIFIED}  # what `gearshift solve --mode` accepts


def status_name(status: int) -> str:
    return TrajectoryStatus.Name(status).removeprefix("TRAJECTORY_STATUS_").lower()


def as_dict(trajectory: Trajectory) -> dict:
    return MessageToDict(trajectory, preserving_proto_field_name=True)


def as_json(trajectory: Trajectory) -> str:
    return json.dumps(as_dict(trajectory), indent=2)


# The A^2FM tags the live view reads the policy's text by. What is inside a hidden one is shown
# by its own event instead (a tool call, parsed) or by the summary (the answer), never as text.
HIDDEN_TAGS = ("answer", "tool_call", "tool_response", "classification")


class ModelText:
    """The policy's streamed text less its protocol tags and what hidden tags hold, piece by
    piece (read by the A^2FM tags, a tag split across two chunks held back until whole).
    Whitespace at the start of a block and at its end is dropped, so a removed tag leaves no
    blank line."""

    def __init__(self) -> None:
        self.reader = TagReader(a2fm_format.TAG_TEXTS)
        self.inside: str | None = None  # the tag the text is in now; None: plain prose
        self.space = ""  # whitespace shown only if more text follows
        self.started = False

    def enter(self, opener: str) -> None:
        """Text the executor wrote into the transcript itself (a mode's opener): it is not
        streamed, but what streams next is inside it."""
        self.inside = None
        self.feed(opener)
        self.space, self.started = "", False

    def feed(self, text: str) -> str:
        """What of text to show now."""
        shown = []
        for piece in self.reader.feed(text):
            if piece.kind == TAG:
                self.inside = None if piece.text.startswith("</") else piece.text.strip("<>")
            elif self.visible:
                shown.append(piece.text)
        return self._spaced("".join(shown))

    def end_block(self) -> str | None:
        """Closes the block (another event comes): the rest of it to show before a line break,
        None when the block showed nothing."""
        held = self.reader.release()  # a "<" that never became a tag
        tail = self._spaced(held) if self.visible else ""
        shown = self.started
        self.space, self.started = "", False
        return tail if shown else None

    @property
    def visible(self) -> bool:
        return self.inside not in HIDDEN_TAGS

    def _spaced(self, text: str) -> str:
        if not self.started:
            text = text.lstrip()
        body = text.rstrip()
        if not body:
            self.space += text
            return ""
        shown, self.space, self.started = self.space + body, text[len(body):], True
        return shown


class LiveView:
    """Prints an episode's events as they stream in: the mode, each turn's plan, the policy's
    own words, the tool calls and their results, parsed. The answer is left to summary()."""

    def __init__(self, console: Console):
        self.console = console
        self.text = ModelText()

    def show(self, item: executor_pb2.SolveEvent) -> None:
        kind = item.WhichOneof("event")
        if kind == "chunk":
            self._chunk(item)
            return
        if (tail := self.text.end_block()) is not None:
            self.console.print(tail, style="dim", markup=False, highlight=False)
        if kind == "mode_chosen":
            self._mode(item.mode_chosen)
        elif kind == "plan":
            self._plan(item.turn, item.plan)
        elif kind == "tool_call":
            self._call(item.tool_call)
        elif kind == "tool_result":
            self._result(item.tool_result)
        elif kind == "answer_asked":
            self.text.enter(item.answer_asked.opener)
            self.console.print(Text(f"turn {item.turn + 1}: the answer asked for", style="bold"))

    def _mode(self, chosen: executor_pb2.ModeChosen) -> None:
        self.text.enter(MODE_OPENERS.get(chosen.mode, ""))
        strategy = RoutingStrategy.Name(chosen.strategy).removeprefix("ROUTING_STRATEGY_").lower()
        line = Text.assemble(("mode ", "bold"), f"{mode_name(chosen.mode)} ({strategy})")
        self.console.print(line.append(f": {chosen.rationale}" if chosen.rationale else ""))

    def _plan(self, turn: int, made: executor_pb2.PlanMade) -> None:
        self.text.enter(plan_block(made.decision, made.plan, first_turn=turn == 0)[1])
        if made.decision == PlanDecision.PLAN_DECISION_PLAN_NEW:
            plan = " → ".join(step.action for step in made.plan.steps)
        else:
            plan = "continue" if made.decision == PlanDecision.PLAN_DECISION_CONTINUE else "none, act"
        self.console.print(Text.assemble((f"turn {turn + 1} plan", "bold cyan"), f": {plan}"))

    def _chunk(self, item: executor_pb2.SolveEvent) -> None:
        shown = self.text.feed(item.chunk.text)
        if shown:
            self.console.print(shown, end="", style="dim", markup=False, highlight=False)

    def _call(self, call: ToolCall) -> None:
        line = Text.assemble((f"call {call.id}", "bold yellow"), f" {call.name}")
        try:
            arguments = json.loads(call.arguments_json or "{}")
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            line.append(f" {call.arguments_json}")
        elif len(arguments) == 1 and isinstance(value := next(iter(arguments.values())), str):
            line.append(_after_colon(value))  # the one argument most tools take (python's code, a query), as written
        else:
            line.append(" " + ", ".join(f"{name}={value!r}" for name, value in arguments.items()))
        self.console.print(line)

    def _result(self, result: ToolResult) -> None:
        if result.is_error:
            label = "rejected call" if result.call_id.startswith(REJECTED_CALL_PREFIX) else f"error {result.call_id}"
            self.console.print(Text.assemble((label, "bold red"), f": {result.error}"))
            return
        output = result.output.strip() or "(nothing printed)"
        if len(output) > RESULT_CHARS:
            output = f"{output[:RESULT_CHARS]}\n(and {len(output) - RESULT_CHARS} characters more)"
        self.console.print(Text(f"result {result.call_id}", style="bold yellow").append(_after_colon(output)))


RESULT_CHARS = 300  # of a tool's output in the live view; `trajectories show` has all of it


def _after_colon(text: str) -> str:
    """": text" on the same line, or text indented under the line when it has several lines."""
    if "\n" not in text:
        return f": {text}"
    return ":\n" + "\n".join(f"  {line}" for line in text.splitlines())


def summary(trajectory: Trajectory) -> Text:
    """The episode's outcome and figures as a few short lines that wrap cleanly at 80 columns."""
    calls = sum(len(turn.tool_calls) for turn in trajectory.turns)
    verdict = ""
    if trajectory.HasField("reward"):
        verdict = " (correct)" if trajectory.reward.correct else " (wrong)"
    line = Text()
    line.append("answer ", style="bold green").append(trajectory.answer or "none").append(verdict, style="bold")
    line.append(f"\n{mode_name(trajectory.mode, unset='?')} mode, {status_name(trajectory.status)}, "
                f"{len(trajectory.turns)} turn{'s' if len(trajectory.turns) != 1 else ''}, {calls} tool call{'s' if calls != 1 else ''}\n"
                f"{trajectory.usage.input_tokens} + {trajectory.usage.output_tokens} tokens, "
                f"${trajectory.cost.total_usd:.6f}, {trajectory.wall_seconds:.1f} s", style="dim")
    return line


TRAJECTORY_COLUMNS = (
    Column("id"),
    Column("age", priority=2),
    Column("mode"),
    Column("status", priority=1),
    Column("correct"),
    Column("cost $", priority=3, justify="right"),
    Column("tokens", priority=4, justify="right"),
    Column("source", priority=5),
    Column("run", priority=6),
    Column("query", wraps=True),
)
SHORT_ID = 8  # hex digits of an id in a terminal, as git shortens a commit; `trajectories show` takes them


def age(created: datetime, now: datetime) -> str:
    """How long ago, as kubectl writes it: 45s, 12m, 5h, 3d."""
    seconds = max(0, int((now - created).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def trajectories_table(trajectories: list[Trajectory], full: bool, now: datetime | None = None) -> TableData:
    """The rows of `trajectories list`: in a terminal short ids and ages, else full ids and UTC times."""
    now = now or datetime.now(timezone.utc)
    table = TableData(TRAJECTORY_COLUMNS)
    if full:
        table.columns = [Column("created", c.priority) if c.header == "age" else c for c in TRAJECTORY_COLUMNS]
    for t in trajectories:
        created = t.created_at.ToDatetime(tzinfo=timezone.utc)
        table.rows.append([
            t.id if full else t.id[:SHORT_ID],
            created.isoformat(timespec="seconds").replace("+00:00", "Z") if full else age(created, now),
            mode_name(t.mode, unset="?"),
            status_name(t.status),
            ("yes" if t.reward.correct else "no") if t.HasField("reward") else "-",
            f"{t.cost.total_usd:.6f}",
            str(t.usage.input_tokens + t.usage.output_tokens),
            t.task_source or "-",
            t.run_id or "-",
            " ".join(t.query.split()),  # one paragraph: a query's own line breaks would only stretch the row
        ])
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
