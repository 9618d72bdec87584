"""The live view of `gearshift solve` and `gearshift demo`, on the events of real episodes (the
executor on the scripted policy): the mode, each plan, the policy's own words, the tool calls and
their results, each once and parsed; no protocol tag, no raw call, no answer before the summary."""

from __future__ import annotations

import io

import pytest
from gearshift.api.common.v1.common_pb2 import Mode
from gearshift.api.executor.v1 import executor_pb2
from gearshift.console import LiveView, ModelText
from gearshift.settings import Settings
from rich.console import Console

from tests.libs.cli.conftest import episode_stack, stack  # noqa: F401
from tests.services.executor.test_episode import scripted_model, solve


def shown(events: list[executor_pb2.SolveEvent]) -> list[str]:
    out = Console(file=io.StringIO(), width=200, color_system=None)
    view = LiveView(out)
    for item in events:
        view.show(item)
    return out.file.getvalue().splitlines()


def streamed(events: list[executor_pb2.SolveEvent], size: int) -> list[executor_pb2.SolveEvent]:
    """The same events with every chunk's text cut in pieces of size characters, as a model
    streaming token by token sends it: tags then arrive split."""
    pieces = []
    for item in events:
        if item.WhichOneof("event") != "chunk":
            pieces.append(item)
            continue
        text = item.chunk.text
        pieces += [executor_pb2.SolveEvent(turn=item.turn, chunk=executor_pb2.OutputChunk(text=text[i:i + size]))
                   for i in range(0, len(text), size)]
    return pieces


AGENTIC = [
    "mode agentic (model): Arithmetic is safer with a tool.",
    "turn 1 plan: run python → answer",
    "Goal: compute 17*23.",  # the policy's own words, its </plan> gone
    "I will compute it.",  # and its <tool_call> block shown only as the parsed calls below
    "call 1 python: print(17*23)",
    "result 1: 391",
    "rejected call: Call on line 2 names unknown tool 'no_such_tool'; available: crawl_page, python, web_search.",
    "turn 2 plan: run python → answer",
    "The tool says 391.",  # the <answer> is the summary's to show
]


async def test_an_agentic_episode_reads_parsed(stack):
    events = await solve(stack, query="What is 17*23?", reference_answer="391")
    raw = "".join(item.chunk.text for item in events if item.WhichOneof("event") == "chunk")
    assert "</plan>" in raw and "{'id': 1, 'name': 'python'" in raw and "<answer>391" in raw  # what the policy wrote
    assert shown(events) == AGENTIC


@pytest.mark.parametrize("size", [1, 2, 3, 7])
async def test_tags_split_across_chunks_read_the_same(stack, size):
    events = await solve(stack, query="What is 17*23?", reference_answer="391")
    assert shown(streamed(events, size)) == AGENTIC


@pytest.mark.parametrize("mode, lines", [
    (Mode.MODE_REASONING, ["mode reasoning (forced): This question needs careful step-by-step reasoning.", "17*23 = 391."]),
    (Mode.MODE_INSTANT, ["mode instant (forced): This question can be answered directly."]),  # its text is all answer
])
async def test_direct_modes_show_the_reasoning_not_the_answer(stack, mode, lines):
    events = await solve(stack, query="What is 17*23?", mode=mode)
    assert shown(events) == lines
    assert shown(streamed(events, 1)) == lines


def never_calls(body: dict) -> str:
    """The scripted policy, except that its agentic turn neither calls a tool nor answers."""
    reply = scripted_model(body)
    return "Goal: think it over.</plan>\nI know this one." if reply.startswith("Goal: compute") else reply


async def test_the_answer_the_executor_asks_for_is_said_not_shown(tmp_path):
    async with episode_stack(Settings(data_dir=tmp_path, metrics_port=0), never_calls) as running:
        events = await solve(running, query="What is 17*23?")
    assert events[-1].final.trajectory.answer == "42"  # forced: the executor opened <answer> itself
    assert shown(events) == ["mode agentic (model): Arithmetic is safer with a tool.", "turn 1 plan: run python → answer",
                             "Goal: think it over.", "I know this one.", "turn 2: the answer asked for"]


@pytest.mark.parametrize("pieces, lines", [
    (["2 < 3 and 5 > 4"], ["2 < 3 and 5 > 4"]),  # a "<" that starts no tag
    (["<b>bold</b> stays"], ["<b>bold</b> stays"]),  # nor does a tag of no protocol
    (["x is <", "ans"], ["x is <ans"]),  # the start of a tag that never came
    (["\n\n<reasoning>\nstep one\n\n", "step two\n</reason", "ing>\n\n"], ["step one", "", "step two"]),
])
def test_model_text(pieces, lines):
    text = ModelText()
    out = "".join(text.feed(piece) for piece in pieces)
    out += text.end_block() or ""
    assert out.splitlines() == lines
