"""The one tool-call grammar: what a call written as text is, its id, and its OpenAI form.

A call is a dict, written as a Python literal or as JSON (so true, false and null read too):
    {'id': 1, 'name': 'web_search', 'arguments': {'query': '...'}}
"parameters" is read where "arguments" is missing, and arguments given as a JSON string are
read as the object it holds. One line holds one call or a list of calls. A block's lines are
read one by one; a block none of whose lines reads is read whole (one JSON object written over
several lines). The executor runs what this reads, the engines return it as `tool_calls`, and
the format reward accepts exactly the blocks it reads without a problem.

Ids: the model's own id, or the call's position in the generation when it wrote none; a
repeated id gets ".<position>". In OpenAI's form the id is "call_<id>"."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field, replace

MAX_PARALLEL_CALLS = 10


@dataclass(frozen=True)
class Call:
    """One call as written: the model's id (None when it wrote none), the name, the arguments
    as a JSON object string."""

    model_id: object
    name: str
    arguments: str
    line: int = 0  # the call's line in its block, from 1


@dataclass
class Block:
    """What one <tool_call> block holds: its calls, and one problem per line that is none."""

    calls: list[Call] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)  # the lines behind the problems, verbatim
    lines: int = 0  # lines read so far, blank ones aside


def literal(text: str) -> object:
    """A Python literal or JSON value; None when text is neither."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def read_item(item: object) -> Call | str:
    """The call a dict holds, or what is wrong with it."""
    if not isinstance(item, dict):
        return "is not a dict"
    name = item.get("name")
    if not isinstance(name, str) or not name:
        return "has no tool name"
    arguments = item.get("arguments", item.get("parameters"))
    if isinstance(arguments, str):
        arguments = literal(arguments)
    if not isinstance(arguments, dict):
        return "has no arguments dict"
    try:
        encoded = json.dumps(arguments, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):  # sets, bytes and the like: no JSON
        return "has arguments that are not plain JSON values"
    return Call(item.get("id"), name, encoded)


def read_line(line: str) -> list[Call] | str:
    """The calls one line (or a whole block) holds, or what is wrong with it."""
    value = literal(line.strip().rstrip(","))
    if value is None:
        return "is not a dict literal"
    items = value if isinstance(value, list) else [value]
    calls = [read_item(item) for item in items]
    problem = next((call for call in calls if isinstance(call, str)), None)
    return problem if problem or not calls else calls


def read_block(body: str) -> Block:
    """Every call of a block's body, line by line (the whole body when no line reads)."""
    block = Block()
    for line in body.splitlines():
        add_line(block, line)
    if block.unread and not block.calls:
        whole = read_line("\n".join(block.unread))
        if not isinstance(whole, str):
            return Block(calls=[replace(call, line=1) for call in whole], lines=block.lines)
    if not block.calls and not block.unread:
        block.problems.append("The <tool_call> block is empty: write one call per line as a dict.")
    return block


def add_line(block: Block, line: str) -> None:
    """Reads one more line of a block into it (blank lines are nothing)."""
    if not line.strip():
        return
    block.lines += 1
    calls = read_line(line)
    if isinstance(calls, str):
        block.problems.append(f"Call on line {block.lines} {calls}: {line.strip()[:120]}")
        block.unread.append(line)
    else:
        block.calls.extend(replace(call, line=block.lines) for call in calls)


def too_many(count: int) -> str:
    return f"Too many calls ({count}); at most {MAX_PARALLEL_CALLS} per step. Only the first {MAX_PARALLEL_CALLS} were considered."


class CallIds:
    """The ids of one generation's calls, in order (the scheme above)."""

    def __init__(self) -> None:
        self.count = 0
        self.seen: set[str] = set()

    def next(self, model_id: object) -> str:
        self.count += 1
        ident = str(model_id if model_id is not None else self.count)
        if ident in self.seen:
            ident = f"{ident}.{self.count}"
        self.seen.add(ident)
        return ident

    def openai(self, call: Call) -> dict:
        """The next call in OpenAI's form."""
        return openai_tool_call(openai_id(self.next(call.model_id)), call.name, call.arguments)


def openai_id(ident: str) -> str:
    return f"call_{ident}"


def openai_tool_call(call_id: str, name: str, arguments: str) -> dict:
    """One entry of OpenAI's `tool_calls` (arguments a JSON string)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
