"""The A^2FM chat format as OpenAI fields (gearshift.protocol.parsers.a2fm): the default
policy's own outputs split into reasoning, content and tool calls, the same on every chunking,
malformed calls kept as content, the tool line, and where a prompt leaves a generation."""

from __future__ import annotations

import json

import pytest
from gearshift.api.common.v1.common_pb2 import Mode
from gearshift.protocol import a2fm, prompts
from gearshift.protocol.parsers import a2fm as a2fm_format
from gearshift.protocol.parsers import Parsed
from gearshift.protocol.parsers.a2fm import AFTER, ANSWER, DELIBERATE, START, TOOL_CALL
from gearshift.protocol.parsers.a2fm import A2FMSplitter as Splitter

parse = Splitter.parse
from hypothesis import given
from hypothesis import strategies as st

HEAD = "This question needs tools to answer reliably.\n<classification>\ntoolcalling_agent\n</classification>\n"
PLAN = "Plan:\n- Current State: need the product\n- Action: run python to compute it\n"
CALL = "{'id': 1, 'name': 'python', 'arguments': {'code': 'print(48213 * 7719)'}}"
AGENTIC = f"{HEAD}{PLAN}<plan>Goal: the product. Path: python.</plan>\n<tool_call>\n{CALL}\n"  # cut by the stop word
REASONING = ("This question needs careful step-by-step reasoning.\n<classification>\nreasoning_agent\n</classification>\n"
             "<reasoning>20 - 6 = 14.\nSo the answer is 14.</reasoning>\n<answer>14</answer>")


def call(ident: str, code: str, name: str = "python") -> dict:
    return {"id": ident, "type": "function", "function": {"name": name, "arguments": json.dumps({"code": code})}}


CASES = [
    # (text, state the prompt left, reasoning, content, calls)
    (AGENTIC, START, f"{HEAD}{PLAN}<plan>Goal: the product. Path: python.</plan>", None, [call("call_1", "print(48213 * 7719)")]),
    (REASONING, START, REASONING.split("\n<answer>")[0], "14", []),
    ("Goal: g.</plan>\n<tool_call>\n" + CALL + "\n</tool_call>", DELIBERATE, "Goal: g.</plan>", None, [call("call_1", "print(48213 * 7719)")]),
    ("20 - 6 = 14.</reasoning>\n<answer>14</answer>", DELIBERATE, "20 - 6 = 14.</reasoning>", "14", []),
    ("Paris</answer>", ANSWER, None, "Paris", []),
    ("Paris", ANSWER, None, "Paris", []),
    ("Paris</answer>", START, None, "Paris", []),  # the prompt held the opening, unknown to the parser
    ("The tool printed 372156147.\n<answer>372156147</answer>", DELIBERATE, "The tool printed 372156147.", "372156147", []),
    ("Hello! How can I help?", START, None, "Hello! How can I help?", []),  # no tag: a plain chat reply
    ("still thinking, cut by max_tokens", DELIBERATE, "still thinking, cut by max_tokens", None, []),
    ("\n{'id': 1, 'name': 'python', 'arguments': {'code': 'print(1)'}}\n", TOOL_CALL, None, None, [call("call_1", "print(1)")]),
]


@pytest.mark.parametrize(("text", "state", "reasoning", "content", "calls"), CASES)
def test_the_default_policys_outputs(text, state, reasoning, content, calls):
    assert parse(text, state) == Parsed(reasoning, content, calls)


def split(text: str, state: str, cuts: list[int], parse_tools: bool = True) -> Parsed:
    splitter, pieces, at = Splitter(state, parse_tools), [], 0
    for cut in sorted(cuts) + [len(text)]:
        pieces += splitter.feed(text[at:cut])
        at = max(at, cut)
    pieces += splitter.finish()
    joined = {kind: "".join(p.text for p in pieces if p.kind == kind) or None for kind in ("reasoning", "content")}
    return Parsed(joined["reasoning"], joined["content"], [p.call for p in pieces if p.kind == "tool_call"])


@given(st.sampled_from(CASES), st.lists(st.integers(min_value=0, max_value=400), max_size=30))
def test_every_chunking_gives_the_whole_texts_fields(case, cuts):
    text, state = case[0], case[1]
    assert split(text, state, cuts) == parse(text, state)


@given(st.sampled_from(CASES), st.lists(st.integers(min_value=0, max_value=400), max_size=30))
def test_reasoning_first_then_calls_gives_the_same_fields(case, cuts):
    """vLLM's way: the reasoning parser leaves the blocks verbatim, the tool parser reads them
    from where the action began."""
    text, state = case[0], case[1]
    first = split(text, state, cuts, parse_tools=False)
    second = parse(first.content or "", AFTER)
    assert (first.reasoning, second.content, second.tool_calls) == (lambda p: (p.reasoning, p.content, p.tool_calls))(parse(text, state))


def test_parallel_calls_keep_their_order_and_ids_stay_stable():
    block = ("<tool_call>\n{'id': 1, 'name': 'python', 'arguments': {'code': 'print(1)'}}\n"
             "{'id': 2, 'name': 'web_search', 'arguments': {'query': 'x', 'flag': True, 'none': None}}\n"
             "{'name': 'python', 'arguments': {'code': 'print(3)'}}\n"
             "{'id': 1, 'name': 'python', 'arguments': {'code': 'print(4)'}}\n</tool_call>")
    calls = parse(block).tool_calls
    assert [c["id"] for c in calls] == ["call_1", "call_2", "call_3", "call_1.4"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"query": "x", "flag": True, "none": None}
    assert parse(block).tool_calls == calls


def test_json_calls_and_a_call_over_several_lines_are_read():
    assert parse('<tool_call>\n{"name": "f", "arguments": {"x": true}}\n</tool_call>').tool_calls[0]["function"] == {
        "name": "f", "arguments": '{"x": true}'}
    spread = '<tool_call>\n{"name": "f",\n "arguments": {"x": 1}}\n</tool_call>'
    assert parse(spread).tool_calls[0]["function"]["arguments"] == '{"x": 1}' and parse(spread).content is None


@pytest.mark.parametrize("line", [
    "{'id': 1, 'name': 'France'}",  # no arguments (the default policy wrote this for a fact)
    "{'name': 'python', 'arguments': 'print(1)'}",  # arguments not a dict
    "print(48213 * 7719)",
    "{'name': 'python', 'arguments': {'code': {1, 2}}}",  # no JSON for a set
])
def test_a_call_that_does_not_parse_stays_in_the_content(line):
    parsed = parse(f"{HEAD}<tool_call>\n{line}\n</tool_call>\n<tool_answer>Paris</tool_answer>")
    assert parsed.tool_calls == []
    assert parsed.content == f"<tool_call>\n{line}\n</tool_call>\n<tool_answer>Paris</tool_answer>"


def test_a_bad_line_beside_good_ones_costs_only_itself():
    parsed = parse(f"<tool_call>\n{CALL}\nnot a call\n</tool_call>")
    assert [c["id"] for c in parsed.tool_calls] == ["call_1"] and parsed.content == "<tool_call>\nnot a call\n</tool_call>"


def test_the_platforms_tools_render_the_trained_tool_line():
    assert prompts.SYSTEM_PROMPT.endswith("\n" + a2fm_format.render_tools_line(a2fm_format.DEFAULT_TOOLS))


def test_declared_tools_render_name_parameters_and_description():
    tools = [{"type": "function", "function": {"name": "lookup", "description": "Finds a word.\n",
                                               "parameters": {"type": "object", "properties": {"word": {}, "lang": {}}}}},
             {"name": "now"}]
    assert a2fm_format.render_tools_line(tools) == "Tools: lookup(word, lang) Finds a word; now()."


@pytest.mark.parametrize(("turn", "state"), [
    ("", START),
    (a2fm.forced_prefix(Mode.MODE_AGENTIC), DELIBERATE),
    (a2fm.forced_prefix(Mode.MODE_REASONING) + "<reasoning>", DELIBERATE),
    (a2fm.forced_prefix(Mode.MODE_INSTANT) + "<answer>", ANSWER),
    (HEAD + "<tool_call>\n", TOOL_CALL),
    (HEAD + "<tool_call>\n" + CALL + "\n</tool_call>" + a2fm.tool_response([("1", "372156147")]), DELIBERATE),
    (HEAD + "<answer>x</answer>", AFTER),
    ("The answer is", START),
])
def test_the_state_a_prompt_leaves(turn, state):
    assert a2fm_format.turn_state(turn) == state


@pytest.mark.parametrize(("messages", "flags", "state"), [
    ([{"role": "user", "content": "q"}], {}, START),
    ([{"role": "user", "content": "q"}], {"template_kwargs": {"enable_thinking": False}}, ANSWER),
    ([{"role": "user", "content": "q"}], {"template_kwargs": {"enable_thinking": True}}, DELIBERATE),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": []}, {"role": "tool", "content": "1"}], {},
     DELIBERATE),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "text", "text": HEAD + "<tool_call>"}]}],
     {"continue_final_message": True, "add_generation_prompt": False}, TOOL_CALL),
    ([{"role": "user", "content": "q"}, {"role": "tool", "content": "1"}, {"role": "assistant", "content": "The tool"}],
     {"continue_final_message": True, "add_generation_prompt": False}, DELIBERATE),
])
def test_the_state_a_request_leaves(messages, flags, state):
    assert a2fm_format.generation_state(messages, **flags) == state
