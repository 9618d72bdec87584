"""The A^2FM chat format as OpenAI's native fields: an assistant text split into reasoning,
content and tool calls, and tool declarations written as the system prompt's tool line. Serving
engines use it (vLLM loads it by path from its own virtual environment through
gearshift/vllm_plugins/a2fm_parsers.py), so it imports nothing but the standard library.

One A^2FM step reads  [deliberation] action, where
  deliberation  the routing rationale, the <classification> block, "Plan:" (SR2AM) and
                <plan> / <reasoning> blocks: everything the model writes before it acts;
  action        <tool_call> blocks (one Python dict literal per line, parallel calls) or
                <answer>...</answer>.
It comes back as
  reasoning     the deliberation verbatim, tags included (the chat template renders it back as
                written, and the route stays visible); stripped of surrounding whitespace;
  tool_calls    {"id": "call_<the model's id>", "type": "function",
                 "function": {"name": ..., "arguments": <JSON string>}} per call, in order;
  content       the answer's text without its tags, then any other text after the action
                (a <tool_call> line that does not parse stays there verbatim: nothing is lost).
A text with no A^2FM tag at all is content. The streaming form (Splitter) gives the same pieces
on any chunking: a tag cut across chunks is held back until it is whole, and text before the
first tag is held until a tag says what it is.

Ids are stable: the same text always gives the same ids, "call_<id>" from the model's own 'id'
(its position when it wrote none), "call_<id>.<position>" when it repeats an id.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
RESPONSE_CLOSE = "</tool_response>"
DELIBERATION_TAGS = tuple(f"<{slash}{name}>" for name in ("classification", "reasoning", "plan", "summary") for slash in ("", "/"))
ACTION_OPENERS = (TOOL_OPEN, ANSWER_OPEN)
# The A^2FM turn pauses for the environment after a call and ends after the answer.
STOP_WORDS = (TOOL_CLOSE, ANSWER_CLOSE)

# Where a generation starts in the A^2FM step (turn_state reads it off the prompt's assistant turn).
START = "start"  # nothing written yet: text waits for its first tag
DELIBERATE = "deliberate"  # the turn is under way, the step has not acted yet
ANSWER = "answer"  # inside <answer>
TOOL_CALL = "tool_call"  # inside a <tool_call> block
AFTER = "after"  # the step has acted: what follows is content

# The platform's own tools (gearshift.protocol.prompts.SYSTEM_PROMPT's last line), declared the
# OpenAI way: render_tools_line(DEFAULT_TOOLS) is that line, character for character.
DEFAULT_TOOLS = [
    {"type": "function", "function": {"name": "python", "description": "runs Python and returns what it prints",
                                      "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}},
    {"type": "function", "function": {"name": "web_search", "description": "searches documents",
                                      "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
    {"type": "function", "function": {"name": "crawl_page", "description": "reads a document",
                                      "parameters": {"type": "object", "properties": {"id": {"type": "string"}, "query": {"type": "string"}},
                                                     "required": ["id"]}}},
]


def render_tools_line(tools: list[dict]) -> str:
    """The system prompt's tool line for OpenAI tool declarations ({"type": "function",
    "function": {...}} or the bare function): "Tools: name(param, ...) description; ...". The
    chat template (a2fm_chat_template.jinja) writes the same line."""
    entries = []
    for tool in tools:
        function = tool.get("function", tool)
        params = ", ".join((function.get("parameters") or {}).get("properties") or {})
        description = (function.get("description") or "").replace("\n", " ").strip().rstrip(".")
        entries.append(f"{function['name']}({params}) {description}".rstrip())
    return "Tools: " + "; ".join(entries) + "."


@dataclass
class Parsed:
    """An assistant text in OpenAI's fields (None where empty)."""

    reasoning: str | None
    content: str | None
    tool_calls: list[dict] = field(default_factory=list)


@dataclass
class Piece:
    """A part of the output: kind is "reasoning", "content" or "tool_call" (then call is set)."""

    kind: str
    text: str = ""
    call: dict | None = None


def parse(text: str, state: str = START, parse_tools: bool = True) -> Parsed:
    """The whole-text form of Splitter."""
    splitter = Splitter(state, parse_tools)
    pieces = splitter.feed(text) + splitter.finish()
    reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
    content = "".join(p.text for p in pieces if p.kind == "content")
    return Parsed(reasoning or None, content or None, [p.call for p in pieces if p.kind == "tool_call"])


def turn_state(turn: str) -> str:
    """Where a generation starts that continues the assistant turn text `turn` (the prompt after
    the assistant turn's opening): inside the last step's answer or call, after its action,
    deliberating (the turn is under way), or at the start."""
    step_at = turn.rfind(RESPONSE_CLOSE)
    step = turn[step_at + len(RESPONSE_CLOSE):] if step_at >= 0 else turn
    last = {tag: step.rfind(tag) for tag in (TOOL_OPEN, TOOL_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)}
    if last[TOOL_OPEN] > last[TOOL_CLOSE] and last[TOOL_OPEN] > last[ANSWER_OPEN]:
        return TOOL_CALL
    if last[ANSWER_OPEN] > last[ANSWER_CLOSE] and last[ANSWER_OPEN] > last[TOOL_OPEN]:
        return ANSWER
    if max(last[TOOL_CLOSE], last[ANSWER_CLOSE]) >= 0:
        return AFTER
    if step_at >= 0 or any(tag in step for tag in DELIBERATION_TAGS):
        return DELIBERATE
    return START


def generation_state(messages: list, add_generation_prompt: bool = True, continue_final_message: bool = False,
                     template_kwargs: dict | None = None) -> str:
    """turn_state of the prompt the chat template renders for these chat messages (dicts, as the
    OpenAI API sends them), without rendering it: a continued assistant message, a tool result
    (the turn goes on), a mode the template pins with enable_thinking, or a fresh turn."""
    last = messages[-1] if messages else {}
    role = _field(last, "role")
    if continue_final_message and role == "assistant":
        after_tool = len(messages) > 1 and _field(messages[-2], "role") == "tool"
        return turn_state((RESPONSE_CLOSE if after_tool else "") + _text(_field(last, "content")))
    if not add_generation_prompt:
        return START
    if role == "tool":
        return DELIBERATE
    thinking = (template_kwargs or {}).get("enable_thinking")
    return START if thinking is None else DELIBERATE if thinking else ANSWER


def _field(message: object, name: str) -> object:
    return message.get(name) if isinstance(message, dict) else getattr(message, name, None)


def _text(content: object) -> str:
    """A message's text: a string, or the text of OpenAI content parts."""
    if isinstance(content, str):
        return content
    return "".join(_field(part, "text") or "" for part in content or [] if _field(part, "type") == "text")


# The tool calls

def _literal(text: str) -> object:
    try:
        return ast.literal_eval(text)  # A^2FM writes Python dict literals
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    try:
        return json.loads(text)  # JSON's true/false/null are no Python literals
    except ValueError:
        return None


def call_of(item: object) -> tuple[object, str, str] | None:
    """(the model's id or None, name, arguments as a JSON string) of one call written as a dict
    {'id': 1, 'name': 'f', 'arguments': {...}} ("parameters" and JSON-string arguments are read
    too); None when it is not one."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
        return None
    arguments = item.get("arguments", item.get("parameters"))
    if isinstance(arguments, str):
        arguments = _literal(arguments)
    if not isinstance(arguments, dict):
        return None
    try:
        encoded = json.dumps(arguments, ensure_ascii=False)
    except (TypeError, ValueError):  # sets, bytes and the like: no JSON
        return None
    return item.get("id"), item["name"], encoded


def calls_of_line(line: str) -> list[tuple[object, str, str]] | None:
    """The calls one line (or a whole block) holds: a dict, or a list of dicts; None if not."""
    value = _literal(line.strip().rstrip(","))
    items = value if isinstance(value, list) else [value]
    calls = [call_of(item) for item in items]
    return calls if calls and all(calls) else None


def held_back(text: str, tags: tuple[str, ...] | list[str]) -> int:
    """Length of the longest end of text that could still grow into one of the tags."""
    longest = 0
    for tag in tags:
        for size in range(min(len(tag) - 1, len(text)), longest, -1):
            if text.endswith(tag[:size]):
                longest = size
                break
    return longest


def _first(text: str, tags: tuple[str, ...]) -> tuple[int, str]:
    hits = [(text.find(tag), tag) for tag in tags]
    hits = [hit for hit in hits if hit[0] >= 0]
    return min(hits) if hits else (-1, "")


class Splitter:
    """Incremental A^2FM splitter: feed() text as it is generated, finish() at the end. The
    pieces of any chunking, joined by kind, equal parse() of the whole text: each kind's text
    starts without leading whitespace, and trailing whitespace waits for more text of its kind.

    state: where the generation starts (turn_state). parse_tools=False keeps <tool_call> blocks
    verbatim in the content (for a later tool parser); the answer's tags are removed either way.
    """

    def __init__(self, state: str = START, parse_tools: bool = True):
        self.state = state
        self.parse_tools = parse_tools
        self._buffer = TOOL_OPEN if state == TOOL_CALL and not parse_tools else ""  # a verbatim block keeps its opener
        self._block_lines: list[str] = []  # lines of the open block that did not parse
        self._block_calls = 0  # calls the open block has given
        self._pending = {"reasoning": "", "content": ""}  # trailing whitespace held back
        self._started = {"reasoning": False, "content": False}
        self._calls = 0
        self._ids: set[str] = set()

    @property
    def acting(self) -> bool:
        """Whether the step's action has begun (what follows is no reasoning)."""
        return self.state in (ANSWER, TOOL_CALL, AFTER)

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        pieces: list[Piece] = []
        while self._buffer and getattr(self, f"_{self.state}")(pieces):
            pass
        return pieces

    def release(self) -> str:
        """The text held back unread (a tag not yet whole), handed over raw: for a reader that
        takes the rest of the stream from here (vLLM's tool phase after the reasoning)."""
        rest, self._buffer = self._buffer, ""
        return rest

    def finish(self) -> list[Piece]:
        """The rest: text still held (a tag never completed, text before a first tag that never
        came) goes where the state says; an open block is parsed as if closed."""
        pieces: list[Piece] = []
        rest, self._buffer = self._buffer, ""
        if self.state == TOOL_CALL and self.parse_tools:
            self._block_line(pieces, rest)
            self._close_block(pieces, closed=False)
        else:
            self._emit(pieces, "reasoning" if self.state == DELIBERATE else "content", rest)
        self.state = AFTER
        return pieces

    # One method per state: consume what the buffer allows; True when the state changed and
    # the buffer should be read again, False when it waits for more text.

    def _start(self, pieces: list[Piece]) -> bool:
        at, tag = _first(self._buffer, DELIBERATION_TAGS + ACTION_OPENERS + (ANSWER_CLOSE, TOOL_CLOSE))
        if at < 0:
            return False
        self.state = {ANSWER_CLOSE: ANSWER, TOOL_CLOSE: TOOL_CALL}.get(tag, DELIBERATE)
        if self.state == TOOL_CALL and self.parse_tools is False:
            self._buffer = TOOL_OPEN + self._buffer
        return True

    def _deliberate(self, pieces: list[Piece]) -> bool:
        at, tag = _first(self._buffer, ACTION_OPENERS)
        if at < 0:
            keep = held_back(self._buffer, ACTION_OPENERS)
            self._emit(pieces, "reasoning", self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep:]
            return False
        self._emit(pieces, "reasoning", self._buffer[:at])
        self._open(tag, at)
        return True

    def _answer(self, pieces: list[Piece]) -> bool:
        at = self._buffer.find(ANSWER_CLOSE)
        if at < 0:
            keep = held_back(self._buffer, (ANSWER_CLOSE,))
            self._emit(pieces, "content", self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep:]
            return False
        self._emit(pieces, "content", self._buffer[:at])
        self._buffer = self._buffer[at + len(ANSWER_CLOSE):]
        self.state = AFTER
        return True

    def _tool_call(self, pieces: list[Piece]) -> bool:
        if not self.parse_tools:
            return self._verbatim_block(pieces)
        while True:
            close, newline = self._buffer.find(TOOL_CLOSE), self._buffer.find("\n")
            if newline >= 0 and (close < 0 or newline < close):
                self._block_line(pieces, self._buffer[:newline])
                self._buffer = self._buffer[newline + 1:]
                continue
            if close < 0:
                return False
            self._block_line(pieces, self._buffer[:close])
            self._buffer = self._buffer[close + len(TOOL_CLOSE):]
            self._close_block(pieces, closed=True)
            self.state = AFTER
            return True

    def _verbatim_block(self, pieces: list[Piece]) -> bool:
        at = self._buffer.find(TOOL_CLOSE)
        if at < 0:
            keep = held_back(self._buffer, (TOOL_CLOSE,))
            self._emit(pieces, "content", self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep:]
            return False
        self._emit(pieces, "content", self._buffer[: at + len(TOOL_CLOSE)])
        self._buffer = self._buffer[at + len(TOOL_CLOSE):]
        self.state = AFTER
        return True

    def _after(self, pieces: list[Piece]) -> bool:
        at, tag = _first(self._buffer, ACTION_OPENERS + (ANSWER_CLOSE,))
        if at < 0:
            keep = held_back(self._buffer, ACTION_OPENERS + (ANSWER_CLOSE,))
            self._emit(pieces, "content", self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep:]
            return False
        self._emit(pieces, "content", self._buffer[:at])
        if tag == ANSWER_CLOSE:  # a closing tag whose opening the prompt held
            self._buffer = self._buffer[at + len(tag):]
        else:
            self._open(tag, at)
        return True

    # Helpers

    def _open(self, tag: str, at: int) -> None:
        """Enter the action the tag opens (the opener stays in a verbatim block)."""
        verbatim = tag == TOOL_OPEN and not self.parse_tools
        self._buffer = self._buffer[at if verbatim else at + len(tag):]
        self.state = TOOL_CALL if tag == TOOL_OPEN else ANSWER

    def _block_line(self, pieces: list[Piece], line: str) -> None:
        if not line.strip():
            return
        calls = calls_of_line(line)
        if calls is None:
            self._block_lines.append(line)
            return
        self._block_calls += len(calls)
        for call in calls:
            pieces.append(Piece("tool_call", call=self._call(*call)))

    def _close_block(self, pieces: list[Piece], closed: bool) -> None:
        """The lines that did not parse: in a block that gave no call, the block as one literal
        (a JSON object over several lines, a list), else verbatim content."""
        lines, self._block_lines = self._block_lines, []
        gave, self._block_calls = self._block_calls, 0
        if not lines:
            return
        calls = None if gave else calls_of_line("\n".join(lines))
        if calls is not None:
            for call in calls:
                pieces.append(Piece("tool_call", call=self._call(*call)))
            return
        self._emit(pieces, "content", TOOL_OPEN + "\n" + "\n".join(lines) + ("\n" + TOOL_CLOSE if closed else ""))

    def _call(self, model_id: object, name: str, arguments: str) -> dict:
        self._calls += 1
        ident = f"call_{model_id if model_id is not None else self._calls}"
        if ident in self._ids:
            ident = f"{ident}.{self._calls}"
        self._ids.add(ident)
        return {"id": ident, "type": "function", "function": {"name": name, "arguments": arguments}}

    def _emit(self, pieces: list[Piece], kind: str, text: str) -> None:
        if not self._started[kind]:
            text = text.lstrip()
        if not text:
            return
        body = text.rstrip()
        if body:
            pieces.append(Piece(kind, self._pending[kind] + body))
            self._started[kind] = True
            self._pending[kind] = ""
        self._pending[kind] += text[len(body):]
