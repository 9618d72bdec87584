"""Formats of chat models that think in tags and call tools in <tool_call> blocks, as vLLM's
reasoning and tool parsers read them: "think" reads <think> and <reasoning> blocks as
reasoning and any block grammar below; "hermes" (hermes.py) and "qwen3_coder" (qwen3_coder.py)
read one grammar each. A block's calls become tool calls; lines that read as none stay in the
content verbatim, so nothing is lost. A block left open at the end (the stop word) is read too."""

from __future__ import annotations

import json
import re

from . import calls as grammar
from .base import CONTENT, REASONING, TOOL_CALL, Piece, Splitter, register

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
REASONING_TAGS = {"<think>": "</think>", "<reasoning>": "</reasoning>"}
FUNCTION_OPEN = "<function="

# Qwen3-Coder's XML calls: <function=name><parameter=x>1</parameter></function>; a parameter's value
# is JSON when it reads as JSON, else the text itself.
_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)(?:</function>|$)", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.S)


def read_functions(body: str) -> grammar.Block:
    block = grammar.Block()
    for name, inner in _FUNCTION.findall(body):
        arguments = {key: _value(value) for key, value in _PARAMETER.findall(inner)}
        block.calls.append(grammar.Call(None, name, json.dumps(arguments, ensure_ascii=False), line=len(block.calls) + 1))
    if not block.calls:
        block.problems.append("no <function=...> in the block")
        block.unread.append(body)
    return block


def _value(raw: str) -> object:
    value = raw.strip()
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return value


@register("think")
class ThinkSplitter(Splitter):
    """state content (default) or reasoning (a continuation inside a thinking block);
    parse_reasoning / parse_tools off leave those tags in the content; trim off gives the text
    as generated (a continued assistant message)."""

    initial = CONTENT

    def __init__(self, state: str | None = None, parse_tools: bool = True, parse_reasoning: bool = True, trim: bool = True):
        super().__init__(state, trim)
        self.openers = (tuple(REASONING_TAGS) if parse_reasoning else ()) + ((TOOL_OPEN,) if parse_tools else ())
        self._close = next(iter(REASONING_TAGS.values()))  # the closer of the block the text is in
        self._ids = grammar.CallIds()

    def read_block(self, body: str) -> grammar.Block:
        """The calls of one block body, in this format's grammar."""
        if body.strip().startswith(FUNCTION_OPEN):
            return read_functions(body)
        return grammar.read_block(body)

    def _content(self, pieces: list[Piece]) -> bool:
        tag = self._until(pieces, CONTENT, self.openers)
        if tag is None:
            return False
        self.state, self._close = ("tool", TOOL_CLOSE) if tag == TOOL_OPEN else (REASONING, REASONING_TAGS[tag])
        return True

    def _reasoning(self, pieces: list[Piece]) -> bool:
        if self._until(pieces, REASONING, (self._close,)) is None:
            return False
        self.state = CONTENT
        return True

    def _tool(self, pieces: list[Piece]) -> bool:
        at = self._buffer.find(TOOL_CLOSE)
        if at < 0:
            return False
        body, self._buffer = self._buffer[:at], self._buffer[at + len(TOOL_CLOSE):]
        self._read(pieces, body, closed=True)
        self.state = CONTENT
        return True

    def _finish(self, pieces: list[Piece], rest: str) -> None:
        if self.state == "tool":
            self._read(pieces, rest, closed=False)
        else:
            self._emit(pieces, self.state, rest)
        self.state = CONTENT

    def _read(self, pieces: list[Piece], body: str, closed: bool) -> None:
        block = self.read_block(body)
        for call in block.calls:
            pieces.append(Piece(TOOL_CALL, call=self._ids.openai(call)))
        if block.unread or not block.calls:
            kept = body if not block.calls else "\n" + "\n".join(block.unread) + "\n"
            self._emit(pieces, CONTENT, TOOL_OPEN + kept + (TOOL_CLOSE if closed else ""))
