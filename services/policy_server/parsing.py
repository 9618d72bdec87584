"""Splits a chat model's raw text into content, reasoning and tool calls, the way vLLM's reasoning
and tool-call parsers do, so callers get the same OpenAI fields from this server and from vLLM.

Reasoning: text inside <think>...</think> or <reasoning>...</reasoning> becomes
`reasoning_content` (an unclosed block runs to the end of the text).

Tool calls (only when the request gave tools): each <tool_call>...</tool_call> block holds
  - hermes JSON:       {"name": "f", "arguments": {"x": 1}}  (one object, a list, or one per line)
  - A^2FM dict lines:  {'id': 1, 'name': 'f', 'arguments': {'x': 1}}  (Python literals, one per line)
  - Qwen3-Coder XML:   <function=f><parameter=x>1</parameter></function>
A block that parses into none of these stays in the content verbatim, so nothing is lost. A block
left open at the end (generation stopped at the `</tool_call>` stop word) is parsed too.

Replies of the A^2FM chat template that ask for OpenAI's fields are read by
gearshift.protocol.native_format instead, as vLLM's a2fm parsers read them (ReplyFormat).
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass

from gearshift.protocol import native_format

REASONING_TAGS = {"<think>": "</think>", "<reasoning>": "</reasoning>"}
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"

_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)(?:</function>|$)", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.S)


def _call(name: str, arguments: dict, call_id: object = None) -> dict:
    """One call in the OpenAI `tool_calls` form (arguments as a JSON string)."""
    ident = f"call_{call_id}" if call_id is not None else f"call_{uuid.uuid4().hex[:24]}"
    return {"id": ident, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _literal(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return ast.literal_eval(text)  # A^2FM writes Python dict literals


def _from_item(item: object) -> dict | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return _call(item["name"], arguments, item.get("id"))


def _xml_value(raw: str) -> object:
    value = raw.strip()
    try:
        return json.loads(value)
    except ValueError:
        return value


def parse_tool_block(body: str) -> list[dict] | None:
    """The calls in the body of one <tool_call> block, or None when it does not parse."""
    body = body.strip()
    if not body:
        return None
    if body.startswith("<function="):
        calls = []
        for name, inner in _FUNCTION.findall(body):
            arguments = {key: _xml_value(value) for key, value in _PARAMETER.findall(inner)}
            calls.append(_call(name, arguments))
        return calls or None
    try:
        whole = _literal(body)
        items = whole if isinstance(whole, list) else [whole]
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        try:
            items = [_literal(line) for line in body.splitlines() if line.strip()]
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
    calls = [_from_item(item) for item in items]
    if not calls or any(call is None for call in calls):
        return None
    return calls


@dataclass
class Piece:
    """A part of the output: kind is "content", "reasoning" or "tool_call" (then call is set)."""

    kind: str
    text: str = ""
    call: dict | None = None


@dataclass
class OutputSplitter:
    """Incremental splitter: feed() text as it is generated, finish() at the end.

    Works on any chunking, since a tag cut across two chunks is held back until it is whole.
    """

    parse_tools: bool
    parse_reasoning: bool = True  # off for raw continuations of an assistant message
    _state: str = "content"  # "content", "reasoning" or "tool"
    _close: str = ""
    _buffer: str = ""

    def _open_tags(self) -> list[str]:
        return (list(REASONING_TAGS) if self.parse_reasoning else []) + ([TOOL_OPEN] if self.parse_tools else [])

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        pieces: list[Piece] = []
        while self._buffer:
            if self._state == "content":
                hits = [(self._buffer.find(tag), tag) for tag in self._open_tags()]
                hits = [(index, tag) for index, tag in hits if index >= 0]
                if not hits:
                    keep = native_format.held_back(self._buffer, self._open_tags())
                    self._emit(pieces, "content", self._buffer[: len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    break
                index, tag = min(hits)
                self._emit(pieces, "content", self._buffer[:index])
                self._buffer = self._buffer[index + len(tag) :]
                self._state, self._close = ("tool", TOOL_CLOSE) if tag == TOOL_OPEN else ("reasoning", REASONING_TAGS[tag])
            else:
                index = self._buffer.find(self._close)
                if index < 0:
                    if self._state == "reasoning":
                        keep = native_format.held_back(self._buffer, [self._close])
                        self._emit(pieces, "reasoning", self._buffer[: len(self._buffer) - keep])
                        self._buffer = self._buffer[len(self._buffer) - keep :]
                    break
                body, self._buffer = self._buffer[:index], self._buffer[index + len(self._close) :]
                self._close_block(pieces, body, closed=True)
                self._state = "content"
        return pieces

    def finish(self) -> list[Piece]:
        pieces: list[Piece] = []
        body, self._buffer = self._buffer, ""
        if self._state == "content":
            self._emit(pieces, "content", body)
        else:
            self._close_block(pieces, body, closed=False)
        self._state = "content"
        return pieces

    def _close_block(self, pieces: list[Piece], body: str, closed: bool) -> None:
        if self._state == "reasoning":
            self._emit(pieces, "reasoning", body)
            return
        calls = parse_tool_block(body)
        if calls is None:
            self._emit(pieces, "content", TOOL_OPEN + body + (TOOL_CLOSE if closed else ""))
            return
        for call in calls:
            pieces.append(Piece("tool_call", call=call))

    @staticmethod
    def _emit(pieces: list[Piece], kind: str, text: str) -> None:
        if text:
            pieces.append(Piece(kind, text))


@dataclass
class ChatOutput:
    """The assistant message fields of a finished chat completion."""

    content: str | None
    reasoning_content: str | None
    tool_calls: list[dict]


def split_output(text: str, parse_tools: bool, raw: bool = False) -> ChatOutput:
    """The whole-text form of OutputSplitter, for non-streamed replies. raw (a continued
    assistant message): the text comes back as generated, whitespace and tags included, as the
    stream sends it: a leading newline can be what the continuation says."""
    splitter = OutputSplitter(parse_tools, parse_reasoning=not raw)
    pieces = splitter.feed(text) + splitter.finish()
    trim = (lambda s: s) if raw else str.strip
    content = trim("".join(p.text for p in pieces if p.kind == "content"))
    reasoning = trim("".join(p.text for p in pieces if p.kind == "reasoning"))
    calls = [p.call for p in pieces if p.kind == "tool_call"]
    return ChatOutput(content or None, reasoning or None, calls)


@dataclass
class ReplyFormat:
    """How a chat reply's text becomes content, reasoning_content and tool_calls: this module's
    split, or (a2fm_state set) the A^2FM chat format's, as vLLM's a2fm parsers read it
    (gearshift.protocol.native_format: the deliberation as reasoning, the answer's text as
    content, the dict-line blocks as calls), starting where the prompt left the A^2FM step."""

    parse_tools: bool
    raw: bool = False  # a continued assistant message: the text as generated, tags and all
    a2fm_state: str | None = None

    def splitter(self) -> OutputSplitter | native_format.Splitter:
        """A fresh incremental splitter; both kinds give Pieces of kind content, reasoning, tool_call."""
        if self.a2fm_state is not None:
            return native_format.Splitter(self.a2fm_state, self.parse_tools)
        return OutputSplitter(self.parse_tools, parse_reasoning=not self.raw)

    def split(self, text: str) -> ChatOutput:
        if self.a2fm_state is not None:
            parsed = native_format.parse(text, self.a2fm_state, self.parse_tools)
            return ChatOutput(parsed.content, parsed.reasoning, parsed.tool_calls)
        return split_output(text, self.parse_tools, self.raw)
