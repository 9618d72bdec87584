"""The think, hermes and qwen3_coder formats (gearshift.protocol.parsers): reasoning and tool
calls from literal model outputs, whole and streamed."""

from __future__ import annotations

import json

import pytest
from gearshift.protocol import parsers
from gearshift.protocol.parsers import calls


def split_output(text: str, parse_tools: bool, name: str = "think") -> parsers.Parsed:
    return parsers.get(name).parse(text, parse_tools=parse_tools)


def calls_of(text: str) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in split_output(text, True).tool_calls]


def test_hermes_json_call_becomes_a_tool_call_and_leaves_the_content():
    out = split_output('Let me compute.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(17*23)"}}\n</tool_call>', True)
    assert out.content == "Let me compute."
    assert [(c["type"], c["function"]["name"]) for c in out.tool_calls] == [("function", "python")]
    assert json.loads(out.tool_calls[0]["function"]["arguments"]) == {"code": "print(17*23)"}
    assert out.tool_calls[0]["id"].startswith("call_")


def test_several_blocks_lists_and_lines_all_count():
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
        '<tool_call>[{"name": "b", "arguments": {"x": 1}}, {"name": "c", "arguments": "{\\"y\\": 2}"}]</tool_call>'
        '<tool_call>\n{"name": "d", "arguments": {}}\n{"name": "e", "parameters": {"z": 3}}\n</tool_call>'
    )
    assert calls_of(text) == [("a", {}), ("b", {"x": 1}), ("c", {"y": 2}), ("d", {}), ("e", {"z": 3})]
    assert split_output(text, True).content is None


def test_a2fm_python_dict_lines_keep_their_ids():
    text = "<tool_call>\n{'id': 1, 'name': 'web_search', 'arguments': {'query': 'capital of France'}}\n{'id': 2, 'name': 'python', 'arguments': {'code': 'print(1)'}}\n</tool_call>"
    out = split_output(text, True)
    assert [c["id"] for c in out.tool_calls] == ["call_1", "call_2"]
    assert calls_of(text)[0] == ("web_search", {"query": "capital of France"})


def test_qwen3_coder_xml_form():
    text = "<tool_call>\n<function=python>\n<parameter=code>\nprint(2 + 2)\n</parameter>\n<parameter=timeout>5</parameter>\n</function>\n</tool_call>"
    assert calls_of(text) == [("python", {"code": "print(2 + 2)", "timeout": 5})]
    assert split_output(text, True, "qwen3_coder").tool_calls == split_output(text, True).tool_calls
    assert not split_output(text, True, "hermes").tool_calls  # hermes reads JSON only


def test_block_cut_at_the_stop_word_is_still_parsed():
    assert calls_of('Thinking. <tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n') == [("python", {"code": "1"})]


@pytest.mark.parametrize(
    "body",
    ['{"name": "python", "arguments": {"code": ', '{"arguments": {}}', '{"name": "f", "arguments": [1]}', "", "just words"],
)
def test_malformed_blocks_stay_in_the_content_verbatim(body):
    text = f"before <tool_call>{body}</tool_call> after"
    out = split_output(text, True)
    assert out.tool_calls == [] and out.content == text
    assert calls.read_block(body).problems


def test_without_tools_tool_call_text_is_plain_content():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
    assert split_output(text, False).content == text and split_output(text, False).tool_calls == []


def test_think_and_reasoning_blocks_become_reasoning():
    out = split_output("<think>17*23 = 391</think>\nThe answer is 391.", False)
    assert (out.reasoning, out.content) == ("17*23 = 391", "The answer is 391.")
    out = split_output("<reasoning>step one\nstep two</reasoning><answer>391</answer>", False)
    assert (out.reasoning, out.content) == ("step one\nstep two", "<answer>391</answer>")
    unclosed = split_output("<think>still going when max_tokens hit", False)
    assert (unclosed.reasoning, unclosed.content) == ("still going when max_tokens hit", None)


def test_reasoning_then_tool_call_then_nothing():
    out = split_output('<think>need code</think><tool_call>{"name": "python", "arguments": {"code": "x"}}</tool_call>', True)
    assert out.reasoning == "need code" and out.content is None and len(out.tool_calls) == 1


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_streaming_in_any_chunking_gives_the_same_split(size):
    text = 'Hmm <think>plan: call</think>Sure.<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call> <reason ok'
    splitter = parsers.get("think")(parse_tools=True)
    pieces = [p for i in range(0, len(text), size) for p in splitter.feed(text[i : i + size])] + splitter.finish()
    whole = split_output(text, True)
    assert "".join(p.text for p in pieces if p.kind == "content") == "Hmm Sure. <reason ok"
    assert "".join(p.text for p in pieces if p.kind == "reasoning") == whole.reasoning == "plan: call"
    assert [p.call["function"]["name"] for p in pieces if p.kind == "tool_call"] == ["python"]
    assert not any("<" in p.text and "think" in p.text for p in pieces)  # tags never leak into text
