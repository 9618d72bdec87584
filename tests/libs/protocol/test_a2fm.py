"""The A^2FM protocol and its reading (gearshift.protocol.parsers.a2fm) on literal examples of
every tag, and on malformed variants."""

from __future__ import annotations

import json

import pytest
from gearshift.api.common.v1.common_pb2 import Mode
from gearshift.protocol import a2fm
from gearshift.protocol.parsers.a2fm import read_step, tag_content

TOOLS = frozenset({"python", "web_search", "crawl_page"})


def calls_and_problems(block: str) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(id, name, arguments) of each call the executor runs from one <tool_call> block, and its
    observations on the rest."""
    step = read_step(f"<tool_call>\n{block}", TOOLS)
    return [(ident, call.name, call.arguments) for ident, call in step.calls], step.problems


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("Simple fact.\n<classification>\ndefault_agent\n</classification>", Mode.MODE_INSTANT),
        ("Needs steps.<classification>reasoning_agent</classification>", Mode.MODE_REASONING),
        ("Needs a tool.\n<classification>\n toolcalling_agent \n", Mode.MODE_AGENTIC),  # cut by the stop word
        ("<classification>`Reasoning_Agent`</classification>", Mode.MODE_REASONING),
        ("<classification>\nsuper_agent\n</classification>", None),
        ("<classification>\ndefault_agent: answer directly as <", Mode.MODE_INSTANT),
        ("<classification>agent</classification> toolcalling_agent", None),  # a label outside the block
        ("I think instant.", None),
    ],
)
def test_classification(text, mode):
    assert a2fm.parse_classification(text)[0] == mode


def test_classification_keeps_the_rationale():
    mode, rationale = a2fm.parse_classification("Multiplying large numbers.\n<classification>toolcalling_agent</classification>")
    assert (mode, rationale) == (Mode.MODE_AGENTIC, "Multiplying large numbers.")


@pytest.mark.parametrize("mode", [Mode.MODE_INSTANT, Mode.MODE_REASONING, Mode.MODE_AGENTIC])
def test_forced_prefix_round_trips(mode):
    assert a2fm.parse_classification(a2fm.forced_prefix(mode))[0] == mode


def test_tag_content_takes_the_last_block_and_an_unclosed_tail():
    assert tag_content("<answer>1</answer> then <answer>2</answer>", "answer") == "2"
    assert tag_content("<reasoning>think</reasoning><answer>42", "answer") == "42"
    assert tag_content("no tags", "answer") is None


def test_the_forced_answer_opener_closes_an_open_reasoning_block_and_nothing_else():
    assert a2fm.forced_answer_opener("<reasoning>\n17*23 is 17*20 plus") == "\n</reasoning>" + a2fm.FORCED_ANSWER_OPENER
    assert a2fm.forced_answer_opener("<plan>x</plan>\n<tool_call>...</tool_call>\n<tool_response>391</tool_response>") == a2fm.FORCED_ANSWER_OPENER
    assert a2fm.forced_answer_opener("<reasoning>a</reasoning>\n<reasoning>b") == "\n</reasoning>" + a2fm.FORCED_ANSWER_OPENER
    assert a2fm.forced_answer_opener("<reasoning>a</reasoning>\n<answer>the answer goes o") is None  # already answering


def test_parallel_dict_literal_calls():
    block = """
{'id': 1, 'name': 'web_search', 'arguments': {'query': 'capital of France'}}
{'id': 2, 'name': 'python', 'arguments': {'code': 'print(17*23)'}}
"""
    calls, problems = calls_and_problems(block)
    assert problems == []
    assert [(ident, name) for ident, name, _ in calls] == [("1", "web_search"), ("2", "python")]
    assert json.loads(calls[1][2]) == {"code": "print(17*23)"}


def test_json_calls_are_accepted_too():
    calls, problems = calls_and_problems('{"id": 3, "name": "python", "arguments": {"code": "1", "quiet": true, "limit": null}}')
    assert [(ident, json.loads(arguments)) for ident, _, arguments in calls] == [("3", {"code": "1", "quiet": True, "limit": None})]
    assert problems == []


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("{'id': 1, 'name': 'python'", "not a dict literal"),
        ("{'id': 1, 'arguments': {}}", "has no tool name"),
        ("{'id': 1, 'name': 'python'}", "has no arguments dict"),
        ("{'id': 1, 'name': 'rm_rf', 'arguments': {}}", "unknown tool 'rm_rf'"),
        ("{'id': 1, 'name': 'python', 'arguments': 'print(1)'}", "has no arguments dict"),
        ("{'id': 1, 'name': 'python', 'arguments': {'x': {1, 2}}}", "plain JSON"),
        ("[1, 2, 3]", "is not a dict"),
        ("__import__('os').system('ls')", "not a dict literal"),
    ],
)
def test_malformed_calls_become_observations(line, complaint):
    calls, problems = calls_and_problems(line)
    assert calls == []
    assert len(problems) == 1 and complaint in problems[0]


def test_one_bad_call_does_not_sink_the_others():
    block = "{'id': 1, 'name': 'python', 'arguments': {'code': '1'}}\nnonsense\n"
    calls, problems = calls_and_problems(block)
    assert len(calls) == 1 and len(problems) == 1


def test_more_than_ten_calls_are_capped_with_a_note():
    block = "\n".join(f"{{'id': {i}, 'name': 'python', 'arguments': {{'code': '{i}'}}}}" for i in range(12))
    calls, problems = calls_and_problems(block)
    assert len(calls) == 10 and "Too many calls" in problems[0]


def test_duplicate_ids_stay_distinct():
    block = "{'id': 1, 'name': 'python', 'arguments': {}}\n{'id': 1, 'name': 'python', 'arguments': {}}"
    ids = [ident for ident, _, _ in calls_and_problems(block)[0]]
    assert ids == ["1", "1.2"]


def test_empty_block():
    assert "empty" in calls_and_problems("  \n")[1][0]


def test_tool_response_format():
    text = a2fm.tool_response([("1", "391"), ("2", "Error: timeout")])
    assert text == "<tool_response>\nResults for tool call 1:\n391\nResults for tool call 2:\nError: timeout\n</tool_response>\n"


def test_agentic_step_with_plan_summary_and_calls():
    text = (
        "<plan>Goal 1: compute. Path 1.1: python; success: a number.</plan>\n"
        "<summary>Nothing done yet.</summary>\nI will compute it.\n"
        "<tool_call>\n{'id': 1, 'name': 'python', 'arguments': {'code': 'print(2**100)'}}\n"
    )
    step = read_step(text, TOOLS)
    assert step.answer is None and [call.name for _, call in step.calls] == ["python"]


def test_agentic_step_answer_after_calls_wins():
    text = "<tool_call>{'id': 1, 'name': 'python', 'arguments': {}}</tool_call>\nDone.<answer>7</answer>"
    step = read_step(text, TOOLS)
    assert step.answer == "7" and step.calls is None


def test_agentic_step_with_neither():
    step = read_step("I am thinking...", TOOLS)
    assert step.answer is None and step.calls is None
