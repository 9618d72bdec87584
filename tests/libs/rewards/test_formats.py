"""A^2FM format validity per mode, on literal outputs, and answer extraction."""

from __future__ import annotations

import pytest
from gearshift.api.common.v1.common_pb2 import Mode, Trajectory, Turn
from gearshift.protocol.parsers.a2fm import FormatError, blocks
from gearshift.rewards.formats import check_format, final_answer, tool_call_problem

from tests.libs.rewards.trajectories import AGENTIC, AGENTIC_TURNS, INSTANT, REASONING

CALL = "{'id': 1, 'name': 'web_search', 'arguments': {'query': 'capital of France'}}"


@pytest.mark.parametrize(
    ("mode", "outputs", "valid"),
    [
        (INSTANT, ["<answer>Paris</answer>"], True),
        (INSTANT, ["  <answer>Paris</answer>\n"], True),
        (INSTANT, ["<answer>Paris"], True),  # cut by the stop word </answer>
        (INSTANT, ["Simple.\n<classification>\ndefault_agent\n</classification>\n<answer>Paris</answer>"], True),
        (INSTANT, ["Paris"], False),
        (INSTANT, ["I think <answer>Paris</answer>"], False),
        (INSTANT, ["<reasoning>x</reasoning><answer>Paris</answer>"], False),
        (INSTANT, ["<answer></answer>"], False),
        (INSTANT, ["<answer>Paris</answer><answer>Lyon</answer>"], False),
        (INSTANT, ["<classification>reasoning_agent</classification><answer>Paris</answer>"], False),
        (REASONING, ["<reasoning>France's capital is Paris.</reasoning>\n<answer>Paris</answer>"], True),
        (REASONING, ["<reasoning>France's capital", "is Paris.</reasoning><answer>Paris</answer>"], False),  # split tag
        (REASONING, ["<answer>Paris</answer>"], False),
        (REASONING, ["<answer>Paris</answer><reasoning>because</reasoning>"], False),
        (REASONING, ["<reasoning>France's capital is Paris.\n<answer>Paris</answer>"], False),  # nested
        (REASONING, ["<reasoning>  </reasoning><answer>Paris</answer>"], False),
        (AGENTIC, list(AGENTIC_TURNS), True),
        (AGENTIC, [f"<plan>find it</plan>\n<tool_call>\n{CALL}\n{CALL}\n</tool_call>\n<tool_response>\nResults for tool call 1:\nParis\n</tool_response>\n<summary>found</summary><answer>Paris</answer>"], True),
        (AGENTIC, [f"<plan>find it</plan>\n<tool_call>\n{CALL}", "<answer>Paris</answer>"], True),  # </tool_call> is a stop word
        (AGENTIC, ["<plan>just answer</plan><answer>Paris</answer>"], True),
        (AGENTIC, [f"<tool_call>\n{CALL}\n</tool_call>", "<answer>Paris</answer>"], False),  # no plan first
        (AGENTIC, [f"<plan>find it</plan><tool_call>\n{CALL}\n</tool_call>"], False),  # no answer
        (AGENTIC, ["<plan>find it</plan><answer>Paris</answer>", "more text"], False),  # answer not last
        (AGENTIC, ['<plan>p</plan><tool_call>\n{"name": "web_search", "arguments": {"q": true}}\n</tool_call><answer>x</answer>'], True),  # JSON: the executor runs it
        (AGENTIC, ["<plan>p</plan><tool_call>\n{'name': 'web_search'}\n</tool_call><answer>x</answer>"], False),
        (AGENTIC, ["<plan>p</plan><tool_call>\n</tool_call><answer>x</answer>"], False),
        (AGENTIC, ["<plan>p</plan><tool_call>\n" + "\n".join([CALL] * 11) + "\n</tool_call><answer>x</answer>"], False),
        (AGENTIC, ["<plan>p</plan><reasoning>hmm</reasoning><answer>x</answer>"], False),
        (Mode.MODE_UNSPECIFIED, ["<answer>Paris</answer>"], False),
        (INSTANT, [], False),
    ],
)
def test_format_per_mode(mode, outputs, valid):
    check = check_format(mode, outputs)
    assert check.valid is valid, check.reason
    assert bool(check.reason) is not valid


def test_blocks_must_be_flat_and_closed():
    assert [b.tag for b in blocks("a <plan>x</plan> b <answer>y")] == [None, "plan", None, "answer"]
    for text in ("</answer>", "<plan>x", "<plan><answer>x</answer></plan>", "<reasoning>x</answer>"):
        with pytest.raises(FormatError):
            blocks(text)


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        (CALL, None),
        (f"{CALL},\n{CALL}", None),
        ("{'name': 'python', 'arguments': {'code': '__import__(\"os\")'}}", None),  # literals only: nothing runs
        ('{"name": "python", "arguments": {"code": "1", "quiet": true}}', None),  # JSON, as the executor runs it
        ("{'name': 'python', 'parameters': {'code': '1'}}", None),  # "parameters", as the executor reads it
        ("__import__('os').system('true')", "not a dict literal"),
        ("['python', {}]", "not a dict"),
        ("{'name': '', 'arguments': {}}", "no tool name"),
        ("{'name': 'python', 'arguments': 'print(1)'}", "no arguments dict"),
        ("(" * 5000 + ")" * 5000, "not a dict literal"),  # deep nesting
        ("", "empty"),
    ],
)
def test_tool_call_lines(block, problem):
    found = tool_call_problem(block)
    assert (found is None) if problem is None else (problem in found)


@pytest.mark.parametrize(
    ("answer", "outputs", "expected"),
    [
        ("391", ["<answer>390</answer>"], "391"),  # the answer field wins
        ("<answer> 391 </answer>", [], "391"),
        ("", ["<plan>p</plan>", "x <answer>391</answer>"], "391"),
        ("", ["<answer>1</answer>", "<answer>2</answer>"], "2"),
        ("", ["no answer at all"], ""),
    ],
)
def test_final_answer(answer, outputs, expected):
    trajectory = Trajectory(answer=answer, turns=[Turn(output=text) for text in outputs])
    assert final_answer(trajectory) == expected
