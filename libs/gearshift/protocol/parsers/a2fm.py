"""The A^2FM format: the tags, and its readings.

One A^2FM step reads  [deliberation] action, where
  deliberation  the routing rationale, the <classification> block, "Plan:" (SR2AM) and
                <plan> / <reasoning> / <summary> blocks: everything the model writes before it acts;
  action        <tool_call> blocks (calls.py's grammar, one call per line, parallel calls) or
                <answer>...</answer>.

Readings of the same text:
- Splitter ("a2fm"): OpenAI's fields, as vLLM's a2fm parsers and the policy server return them:
  reasoning  the deliberation verbatim, tags included (the chat template renders it back as
             written, and the route stays visible);
  tool_calls calls.openai_tool_call per call, in order;
  content    the answer's text without its tags, then any other text after the action (a
             <tool_call> line that does not parse stays there verbatim: nothing is lost).
  A text with no A^2FM tag at all is content; text before the first tag waits for a tag to say
  what it is.
- EpisodeText: what a client of a whole episode reads (the executor streams it, the gateway
  forwards it): the answer, and what the policy wrote inside <reasoning>.
- blocks(): the tagged blocks of a generation, for the format reward's rules.
- tag_content(): the content of a tag's last block; read_step(): what an agentic turn asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import calls as grammar
from .base import CONTENT, REASONING, TOOL_CALL as CALL_PIECE, Piece, Splitter, first, register
from .tags import TAG, read

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
REASONING_OPEN, REASONING_CLOSE = "<reasoning>", "</reasoning>"
RESPONSE_CLOSE = "</tool_response>"
TAGS = ("classification", "answer", "reasoning", "plan", "tool_call", "tool_response", "summary")
TAG_TEXTS = tuple(f"<{slash}{name}>" for name in TAGS for slash in ("", "/"))
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


@register("a2fm")
class A2FMSplitter(Splitter):
    """The A^2FM step as OpenAI's fields, streamed. state: where the generation starts
    (turn_state). parse_tools=False keeps <tool_call> blocks verbatim in the content (for a
    later tool parser); the answer's tags are removed either way."""

    initial = START

    def __init__(self, state: str | None = None, parse_tools: bool = True):
        super().__init__(state)
        self.parse_tools = parse_tools
        if self.state == TOOL_CALL and not parse_tools:
            self._buffer = TOOL_OPEN  # a verbatim block keeps its opener
        self._block = grammar.Block()  # the open block
        self._ids = grammar.CallIds()

    @property
    def acting(self) -> bool:
        """Whether the step's action has begun (what follows is no reasoning)."""
        return self.state in (ANSWER, TOOL_CALL, AFTER)

    def _finish(self, pieces: list[Piece], rest: str) -> None:
        """Text still held (a tag never completed, text before a first tag that never came)
        goes where the state says; an open block is read as if closed."""
        if self.state == TOOL_CALL and self.parse_tools:
            self._block_line(pieces, rest)
            self._close_block(pieces, closed=False)
        else:
            self._emit(pieces, REASONING if self.state == DELIBERATE else CONTENT, rest)
        self.state = AFTER

    def _start(self, pieces: list[Piece]) -> bool:
        at, tag = first(self._buffer, DELIBERATION_TAGS + ACTION_OPENERS + STOP_WORDS)
        if at < 0:
            return False
        self.state = {ANSWER_CLOSE: ANSWER, TOOL_CLOSE: TOOL_CALL}.get(tag, DELIBERATE)  # a closer: the prompt opened it
        if self.state == TOOL_CALL and not self.parse_tools:
            self._buffer = TOOL_OPEN + self._buffer
        return True

    def _deliberate(self, pieces: list[Piece]) -> bool:
        tag = self._until(pieces, REASONING, ACTION_OPENERS)
        return tag is not None and self._open(tag)

    def _answer(self, pieces: list[Piece]) -> bool:
        if self._until(pieces, CONTENT, (ANSWER_CLOSE,)) is None:
            return False
        self.state = AFTER
        return True

    def _tool_call(self, pieces: list[Piece]) -> bool:
        if not self.parse_tools:  # verbatim, closer included
            if self._until(pieces, CONTENT, (TOOL_CLOSE,)) is None:
                return False
            self._emit(pieces, CONTENT, TOOL_CLOSE)
            self.state = AFTER
            return True
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

    def _after(self, pieces: list[Piece]) -> bool:
        tag = self._until(pieces, CONTENT, ACTION_OPENERS + (ANSWER_CLOSE,))
        if tag is None:
            return False
        return tag == ANSWER_CLOSE or self._open(tag)  # a closing tag whose opening the prompt held is dropped

    def _open(self, tag: str) -> bool:
        """Enters the action the tag opens (the opener stays in a verbatim block)."""
        if tag == TOOL_OPEN and not self.parse_tools:
            self._buffer = tag + self._buffer
        self.state = TOOL_CALL if tag == TOOL_OPEN else ANSWER
        return True

    def _block_line(self, pieces: list[Piece], line: str) -> None:
        read_before = len(self._block.calls)
        grammar.add_line(self._block, line)
        for call in self._block.calls[read_before:]:
            self._call(pieces, call)

    def _close_block(self, pieces: list[Piece], closed: bool) -> None:
        """The lines that did not read: in a block that gave no call, the block read whole,
        else verbatim content."""
        block, self._block = self._block, grammar.Block()
        if not block.unread:
            return
        whole = grammar.read_line("\n".join(block.unread)) if not block.calls else ""
        if not isinstance(whole, str):
            for call in whole:
                self._call(pieces, call)
            return
        self._emit(pieces, CONTENT, TOOL_OPEN + "\n" + "\n".join(block.unread) + ("\n" + TOOL_CLOSE if closed else ""))

    def _call(self, pieces: list[Piece], call: grammar.Call) -> None:
        pieces.append(Piece(CALL_PIECE, call=self._ids.openai(call)))


class EpisodeText(Splitter):
    """What a client of a whole episode reads, streamed: the answer (inside <answer>) as content
    and what the policy wrote inside <reasoning> as reasoning; the rest (routing, plans, calls)
    is neither. Inside a block only its closing tag is a tag, except that <answer> also ends a
    reasoning block never closed. Fed the openers the executor writes too (prompts.MODE_OPENERS,
    a forced answer's), so that what follows lands in its block."""

    initial = "outside"

    def _outside(self, pieces: list[Piece]) -> bool:
        tag = self._until(pieces, None, (ANSWER_OPEN, REASONING_OPEN))
        if tag is None:
            return False
        self.state = "answer" if tag == ANSWER_OPEN else "reasoning"
        return True

    def _answer(self, pieces: list[Piece]) -> bool:
        if self._until(pieces, CONTENT, (ANSWER_CLOSE,)) is None:
            return False
        self.state = "outside"
        return True

    def _reasoning(self, pieces: list[Piece]) -> bool:
        tag = self._until(pieces, REASONING, (REASONING_CLOSE, ANSWER_OPEN))
        if tag is None:
            return False
        self.state = "answer" if tag == ANSWER_OPEN else "outside"
        return True

    def _finish(self, pieces: list[Piece], rest: str) -> None:
        if self.state != "outside":
            self._emit(pieces, CONTENT if self.state == "answer" else REASONING, rest)


# Whole-text readings

@dataclass(frozen=True)
class TextBlock:
    """A tagged block, or free text between blocks (tag None)."""

    tag: str | None
    content: str


class FormatError(ValueError):
    """The text's tags do not form a flat sequence of closed blocks."""


def blocks(text: str, cut_by: tuple[str, ...] = ("answer", "tool_call")) -> list[TextBlock]:
    """One generation as tagged blocks and free text; tags must not nest. A block of the cut_by
    tags may be left open at the end (its stop word ended the generation)."""
    found: list[TextBlock] = []
    free, open_tag, inside = "", None, ""
    for piece in read(text, TAG_TEXTS):
        if piece.kind != TAG:
            if open_tag is None:
                free += piece.text
            else:
                inside += piece.text
            continue
        closing, tag = piece.text.startswith("</"), piece.text.strip("</>")
        if open_tag is None:
            if closing:
                raise FormatError(f"</{tag}> without <{tag}>")
            found.append(TextBlock(None, free))
            open_tag, inside = tag, ""
        elif closing and tag == open_tag:
            found.append(TextBlock(tag, inside))
            open_tag, free = None, ""
        else:
            raise FormatError(f"{piece.text} inside <{open_tag}>")
    if open_tag is not None:
        if open_tag not in cut_by:
            raise FormatError(f"<{open_tag}> is never closed")
        found.append(TextBlock(open_tag, inside))
    else:
        found.append(TextBlock(None, free))
    return [block for block in found if block.tag is not None or block.content.strip()]


def tag_content(text: str, tag: str) -> str | None:
    """The content of the last <tag>...</tag> (each block from its opener to the nearest closer);
    else, the tag left open, what follows its last opener (stop words cut it); stripped. None
    when the tag is not there."""
    opener, closer = f"<{tag}>", f"</{tag}>"
    closed, current, inside, since_opener = [], [], False, None
    for piece in read(text, (opener, closer)):
        is_opener, is_closer = piece.kind == TAG and piece.text == opener, piece.kind == TAG and piece.text == closer
        if is_opener:
            since_opener = []
        elif since_opener is not None:
            since_opener.append(piece.text)
        if is_opener and not inside:
            inside, current = True, []
        elif is_closer and inside:
            closed.append("".join(current))
            inside = False
        elif inside:
            current.append(piece.text)
    if closed:
        return closed[-1].strip()
    return "".join(since_opener).strip() if since_opener is not None else None


@dataclass
class Step:
    """What one agentic generation asked for: the answer, else the calls to run (ids given)
    and one observation per call refused."""

    answer: str | None = None
    calls: list[tuple[str, grammar.Call]] | None = None
    problems: list[str] = field(default_factory=list)


def read_step(text: str, known_tools: frozenset[str] | set[str]) -> Step:
    """An answer written after the last call block ends the episode; else that block's calls
    are run, unknown tools and calls past the limit refused."""
    call_at, answer_at = text.rfind(TOOL_OPEN), text.rfind(ANSWER_OPEN)
    if answer_at > call_at:
        return Step(answer=tag_content(text, "answer"))
    if call_at < 0:
        return Step()
    block = grammar.read_block(tag_content(text[call_at:], "tool_call") or "")
    step, ids = Step(calls=[], problems=block.problems), grammar.CallIds()
    if len(block.calls) > grammar.MAX_PARALLEL_CALLS:
        step.problems.append(grammar.too_many(len(block.calls)))
    for call in block.calls[: grammar.MAX_PARALLEL_CALLS]:
        ident = ids.next(call.model_id)  # a refused call keeps its place: the ids are the engines'
        if call.name not in known_tools:
            step.problems.append(f"Call on line {call.line} names unknown tool {call.name!r}; available: {', '.join(sorted(known_tools))}.")
        else:
            step.calls.append((ident, call))
    return step


# Where a generation starts

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


# The platform's tools, declared the OpenAI way: render_tools_line(DEFAULT_TOOLS) is the last
# line of gearshift.protocol.prompts.SYSTEM_PROMPT, character for character.
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
