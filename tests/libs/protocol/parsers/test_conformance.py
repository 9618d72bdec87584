"""Every consumer of the policy's text reads it the same: the executor (the calls it runs), the
engines (the a2fm format, as the policy server and vLLM's plugins return OpenAI fields), the
format reward (its verdict), the client's view (EpisodeText, streamed by the executor) and the
think format the policy server reads other chat models with.

On a corpus of what the executor stored from the default policy in both protocols
(corpus/default_policy.jsonl, written by scripts/parser-corpus.py) and on hand-made hard lines;
and, by hypothesis, on any chunking of any text: a stream parses as the whole text does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gearshift.api.common.v1.common_pb2 import Mode, Trajectory, TrajectoryStatus
from gearshift.protocol import a2fm, native, parsers
from gearshift.protocol.parsers import a2fm as a2fm_format
from gearshift.protocol.parsers import calls
from gearshift.protocol.parsers.tags import TAG, TagReader
from gearshift.rewards.formats import check_trajectory_format, tool_call_problem
from google.protobuf.json_format import ParseDict
from hypothesis import given, settings
from hypothesis import strategies as st

CORPUS = Path(__file__).with_name("corpus") / "default_policy.jsonl"
TOOLS = frozenset(tool["function"]["name"] for tool in a2fm_format.DEFAULT_TOOLS)
END_OF_MESSAGE = ("<|im_end|>", "<|endoftext|>")


def load_corpus() -> list[tuple[Trajectory, list[str]]]:
    rows = [json.loads(line) for line in CORPUS.read_text().splitlines()]
    return [(ParseDict(row["trajectory"], Trajectory()), row["raw_turns"]) for row in rows]


STORED = load_corpus()
TEXT = [trajectory for trajectory, _ in STORED if not native.is_native(trajectory)]
NATIVE = [(trajectory, raw) for trajectory, raw in STORED if native.is_native(trajectory)]


def test_the_corpus_holds_every_mode_in_both_protocols():
    for episodes in (TEXT, [trajectory for trajectory, _ in NATIVE]):
        assert {trajectory.mode for trajectory in episodes} == {Mode.MODE_INSTANT, Mode.MODE_REASONING, Mode.MODE_AGENTIC}
        assert any(turn.tool_calls for trajectory in episodes for turn in trajectory.turns)


def executor_calls(text: str) -> tuple[list[tuple[str, str, str]], list[str]]:
    step = a2fm_format.read_step(text, TOOLS)
    return [(ident, call.name, call.arguments) for ident, call in step.calls or []], step.problems


def engine_calls(text: str, state: str = a2fm_format.DELIBERATE) -> list[tuple[str, str, str]]:
    return [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in a2fm_format.A2FMSplitter.parse(text, state).tool_calls]


def agree_on_calls(text: str) -> None:
    """The executor runs what the engines return (ids in OpenAI's form), and the reward passes a
    block exactly when the executor refused none of its lines."""
    ran, problems = executor_calls(text)
    returned = engine_calls(text)
    assert [(calls.openai_id(ident), name, arguments) for ident, name, arguments in ran] == [c for c in returned if c[1] in TOOLS]
    block = a2fm_format.tag_content(text[text.rfind(a2fm_format.TOOL_OPEN):], "tool_call")
    if block is not None and text.rfind(a2fm_format.TOOL_OPEN) > text.rfind(a2fm_format.ANSWER_OPEN):
        unknown = [problem for problem in problems if "unknown tool" in problem]
        assert (tool_call_problem(block) is None) == (len(problems) == len(unknown))
        think = parsers.get("think").parse(a2fm_format.TOOL_OPEN + block + a2fm_format.TOOL_CLOSE)
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in think.tool_calls] == [c[1:] for c in returned]


def streamed(splitter, text: str, cuts: list[int]) -> parsers.Parsed:
    edges = [0, *sorted(set(cuts)), len(text)]
    pieces = [piece for start, end in zip(edges, edges[1:]) for piece in splitter.feed(text[start:end])] + splitter.finish()
    return parsers.base.joined(pieces)


READERS = {
    **{name: (lambda name=name: parsers.get(name)()) for name in parsers.FORMATS},
    "a2fm deliberating": lambda: parsers.get("a2fm")(a2fm_format.DELIBERATE),
    "a2fm tools verbatim": lambda: parsers.get("a2fm")(a2fm_format.DELIBERATE, parse_tools=False),
    "episode text": a2fm_format.EpisodeText,
}


def same_in_any_pieces(text: str, cuts: list[int]) -> None:
    for name, reader in READERS.items():
        assert streamed(reader(), text, cuts) == streamed(reader(), text, []), name
    tags = a2fm_format.TAG_TEXTS
    assert merged(streamed_tags(text, cuts, tags)) == merged(streamed_tags(text, [], tags))


def streamed_tags(text: str, cuts: list[int], tags: tuple[str, ...]) -> list:
    reader, edges = TagReader(tags), [0, *sorted(set(cuts)), len(text)]
    return [piece for start, end in zip(edges, edges[1:]) for piece in reader.feed(text[start:end])] + reader.finish()


def merged(pieces: list) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for piece in pieces:
        if out and piece.kind != TAG and out[-1][0] != TAG:
            out[-1] = (piece.kind, out[-1][1] + piece.text)
        else:
            out.append((piece.kind, piece.text))
    return out


# The corpus: the text protocol

@pytest.mark.parametrize("trajectory", TEXT, ids=lambda t: t.query[:30])
def test_the_executor_reads_each_stored_turn_as_it_ran_and_the_engines_read_the_same_calls(trajectory):
    for turn in trajectory.turns:
        if trajectory.mode != Mode.MODE_AGENTIC:
            continue
        ran, problems = executor_calls(turn.output)
        assert ran == [(call.id, call.name, call.arguments_json) for call in turn.tool_calls]
        refused = [result.error for result in turn.tool_results if result.call_id.startswith(a2fm.REJECTED_CALL_PREFIX)]
        assert problems == refused
        agree_on_calls(turn.output)


@pytest.mark.parametrize("trajectory", TEXT, ids=lambda t: t.query[:30])
def test_the_reward_and_the_client_read_the_stored_episode_as_it_was_scored_and_served(trajectory):
    assert check_trajectory_format(trajectory).valid == trajectory.reward.format_valid
    transcript = a2fm.render_transcript(trajectory)
    said = a2fm_format.EpisodeText.parse(transcript)
    if trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED and transcript.endswith(a2fm_format.ANSWER_CLOSE):
        assert said.content == trajectory.answer
    for size in (1, 2, 3, 7):
        same_in_any_pieces(transcript, list(range(size, len(transcript), size)))


# The corpus: the native protocol

def generation_state(trajectory: Trajectory, index: int) -> str:
    """Where the engine started reading turn index: the state of the request that generated it."""
    earlier = Trajectory()
    earlier.CopyFrom(trajectory)
    del earlier.turns[index:]
    upcoming = trajectory.turns[index]
    opened = native.opening_message(upcoming) is not None
    return a2fm_format.generation_state(native.messages(earlier, upcoming), add_generation_prompt=not opened,
                                        continue_final_message=opened, template_kwargs=native.served_kwargs(trajectory))


@pytest.mark.parametrize(("trajectory", "raw"), NATIVE, ids=lambda t: t.query[:30] if isinstance(t, Trajectory) else "")
def test_the_engine_split_each_stored_native_turn_as_the_a2fm_format_reads_its_raw_text(trajectory, raw):
    assert len(raw) == len(trajectory.turns)
    for index, (turn, text) in enumerate(zip(trajectory.turns, raw)):
        for marker in END_OF_MESSAGE:
            text = text.removesuffix(marker)
        parsed = a2fm_format.A2FMSplitter.parse(text, generation_state(trajectory, index), parse_tools=bool(native.served_tools(trajectory)))
        assert (parsed.content or "", parsed.reasoning or "") == (turn.output, turn.reasoning_content)
        assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in parsed.tool_calls] == [
            (call.id, call.name, call.arguments_json) for call in turn.tool_calls]
    assert check_trajectory_format(trajectory).valid == trajectory.reward.format_valid


# Hand-made hard lines

PLAN = "<plan>find it</plan>\n"
HARD = [
    PLAN + '<tool_call>\n{"name": "python", "arguments": {"code": "print(1)", "quiet": true, "limit": null, "echo": false}}\n</tool_call>',
    PLAN + "<tool_call>\n{'id': 7, 'name': 'web_search', 'parameters': {'query': 'capital of France'}}\n</tool_call>",
    PLAN + "<tool_call>\n{'name': 'python', 'arguments': '{\"code\": \"print(2)\"}'}\n</tool_call>",  # arguments as a JSON string
    PLAN + "<tool_call>\n{'id': 1, 'name': 'python', 'arguments': {'code': '1'}}\nnot a call\n{'id': 1, 'name': 'python', 'arguments': {'code': '2'}}\n</tool_call>",
    PLAN + '<tool_call>\n{\n  "name": "python",\n  "arguments": {"code": "print(3)"}\n}\n</tool_call>',  # one object over lines
    PLAN + "<tool_call>\n[{'name': 'python', 'arguments': {}}, {'name': 'web_search', 'arguments': {'query': 'x'}}]\n</tool_call>",
    PLAN + "<tool_call>\n{'name': 'rm_rf', 'arguments': {}}\n{'name': 'python', 'arguments': {'code': '1'}}\n</tool_call>",
    PLAN + "<tool_call>\n{'name': 'python', 'arguments': {'x': {1, 2}}}\n</tool_call>",  # a set: no JSON
    PLAN + "<tool_call>\n{'id': 1, 'name': 'python', 'arguments': {'code': 'print(1 < 2)'}}",  # cut by the stop word
    PLAN + "<tool_call>\n</tool_call>",
    "<plan>outer <plan>nested</plan></plan>\n<answer>x</answer>",
    "<plan>never closed <answer>4</answer>",
    "<reasoning>a < b and <b>bold</b></reasoning>\n<answer>x < y</answer>",
    "<reasoning>unclosed reasoning <answer>5",
    "</answer> a closer first <tool_call>",
    "no tag at all, < and > and </",
]


@pytest.mark.parametrize("text", HARD)
def test_hard_lines_read_the_same_everywhere(text):
    agree_on_calls(text)


@pytest.mark.parametrize("text", HARD)
def test_a_tag_split_at_every_position_reads_the_same(text):
    for at in range(1, len(text)):
        same_in_any_pieces(text, [at])


def test_json_values_and_parameters_are_run_and_pass_the_format_check():
    for text in HARD[:3]:
        ran, problems = executor_calls(text)
        assert len(ran) == 1 and problems == []
        assert tool_call_problem(a2fm_format.tag_content(text, "tool_call")) is None
    assert json.loads(executor_calls(HARD[0])[0][0][2]) == {"code": "print(1)", "quiet": True, "limit": None, "echo": False}


# Any chunking of any text

FRAGMENTS = [*a2fm_format.TAG_TEXTS, "<think>", "</think>", "<function=python>", "<parameter=code>", "</parameter>", "</function>",
             "{'id': 1, 'name': 'python', 'arguments': {'code': '1'}}", '{"name": "web_search", "arguments": {"query": true}}',
             "<", ">", "/", "\n", " ", "  ", "text", "Plan:", "{", "}"]
texts = st.lists(st.sampled_from(FRAGMENTS), max_size=24).map("".join)


@settings(max_examples=300, deadline=None)
@given(texts.flatmap(lambda text: st.tuples(st.just(text), st.lists(st.integers(0, len(text)), max_size=8))))
def test_any_chunking_parses_as_the_whole_text(case):
    text, cuts = case
    same_in_any_pieces(text, cuts)
