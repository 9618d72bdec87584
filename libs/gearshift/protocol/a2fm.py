"""The A^2FM text protocol: classification block, mode tags, parallel dict-literal tool calls,
tool responses. Parsing is tolerant: whatever the model writes becomes either a parsed item or
an explanatory observation for the model, never an exception."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from gearshift.api.common.v1.common_pb2 import Mode, ToolCall, Turn
from gearshift.protocol.prompts import MODE_OPENERS

LABELS = {
    "default_agent": Mode.MODE_INSTANT,
    "reasoning_agent": Mode.MODE_REASONING,
    "toolcalling_agent": Mode.MODE_AGENTIC,
}
LABEL_OF = {mode: label for label, mode in LABELS.items()}

CLASSIFICATION_STOP = "</classification>"
STOP_WORDS = ("</tool_call>", "</answer>")
# What the executor writes when an agentic turn ends with neither a call nor an answer, or when
# the steps run out (ExecutorSettings.answer_at_step_limit).
FORCED_ANSWER_OPENER = "\n<answer>"
MAX_PARALLEL_CALLS = 10
REJECTED_CALL_PREFIX = "rejected-"  # the call id of a tool result that tells the model its call did not parse

# The one-sentence justification injected before a forced classification block.
FORCED_JUSTIFICATION = {
    Mode.MODE_INSTANT: "This question can be answered directly.",
    Mode.MODE_REASONING: "This question needs careful step-by-step reasoning.",
    Mode.MODE_AGENTIC: "This question needs tools to answer reliably.",
}

_CLASSIFICATION = re.compile(r"<classification>\s*(.*?)\s*(?:</classification>|$)", re.S)
_LABEL = re.compile("|".join(LABELS))


def classification_block(mode: int) -> str:
    return f"<classification>\n{LABEL_OF[mode]}\n</classification>\n"


def forced_prefix(mode: int) -> str:
    """The assistant-turn start that pins a mode (A^2FM prefix injection)."""
    return f"{FORCED_JUSTIFICATION[mode]}\n{classification_block(mode)}"


def parse_classification(text: str) -> tuple[int | None, str]:
    """Returns (mode or None when the label is missing or unknown, rationale before the block)."""
    match = _CLASSIFICATION.search(text)
    if not match:
        return None, text.strip()
    label = _LABEL.search(match.group(1).lower())  # tolerant: "default_agent: answer directly" counts
    return (LABELS[label.group(0)] if label else None), text[: match.start()].strip()


def forced_answer_opener(transcript: str) -> str | None:
    """What the executor writes to ask for the answer where a transcript stops: the answer
    opener, after closing a <reasoning> block the model left open; None when an <answer> is
    already open (there is nothing to ask for)."""
    def unclosed(tag: str) -> bool:
        return transcript.rfind(f"<{tag}>") > transcript.rfind(f"</{tag}>")

    if unclosed("answer"):
        return None
    return ("\n</reasoning>" if unclosed("reasoning") else "") + FORCED_ANSWER_OPENER


def answer_was_asked(turns: Sequence[Turn]) -> bool:
    """Whether the executor asked for the trajectory's answer: its last turn opens with the
    injected answer opener (forced_answer_opener, or FORCED_ANSWER_OPENER after a turn with
    neither a call nor an answer)."""
    if not turns or len(turns[-1].injected_spans) < 2 or turns[-1].injected_spans[0] != 0:
        return False
    return turns[-1].output[: turns[-1].injected_spans[1]].endswith(FORCED_ANSWER_OPENER)


def tag_content(text: str, tag: str) -> str | None:
    """The content of the last <tag>...</tag>; an unclosed final tag counts (stop words cut it)."""
    closed = re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.S)
    if closed:
        return closed[-1].strip()
    opened = text.rfind(f"<{tag}>")
    if opened >= 0:
        return text[opened + len(tag) + 2 :].strip()
    return None


@dataclass
class ParsedCalls:
    """Tool calls parsed from one <tool_call> block, and what was wrong with the rest."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one observation per rejected line


def _literal(line: str):
    try:
        return ast.literal_eval(line)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    try:
        return json.loads(line)
    except ValueError:
        return None


def parse_tool_calls(block: str, known_tools: set[str] | frozenset[str]) -> ParsedCalls:
    """Parses 1-10 parallel calls, one Python dict literal per line:
    {'id': 1, 'name': 'web_search', 'arguments': {'query': '...'}}"""
    parsed = ParsedCalls()
    lines = [line.strip().rstrip(",") for line in block.strip().splitlines() if line.strip()]
    if not lines:
        parsed.errors.append("The <tool_call> block is empty: write one call per line as a dict.")
        return parsed
    if len(lines) > MAX_PARALLEL_CALLS:
        parsed.errors.append(f"Too many calls ({len(lines)}); at most {MAX_PARALLEL_CALLS} per step. Only the first {MAX_PARALLEL_CALLS} were considered.")
        lines = lines[:MAX_PARALLEL_CALLS]
    seen_ids: set[str] = set()
    for number, line in enumerate(lines, start=1):
        value = _literal(line)
        if not isinstance(value, dict):
            parsed.errors.append(f"Call on line {number} is not a dict literal: {line[:120]}")
            continue
        missing = [key for key in ("name", "arguments") if key not in value]
        if missing:
            parsed.errors.append(f"Call on line {number} lacks {', '.join(missing)}.")
            continue
        name, arguments = value["name"], value["arguments"]
        if not isinstance(name, str) or name not in known_tools:
            parsed.errors.append(f"Call on line {number} names unknown tool {name!r}; available: {', '.join(sorted(known_tools))}.")
            continue
        if not isinstance(arguments, dict):
            parsed.errors.append(f"Call on line {number}: arguments must be a dict.")
            continue
        call_id = str(value.get("id", number))
        if call_id in seen_ids:
            call_id = f"{call_id}.{number}"
        seen_ids.add(call_id)
        try:
            arguments_json = json.dumps(arguments)
        except (TypeError, ValueError):
            parsed.errors.append(f"Call on line {number}: arguments must be plain JSON values.")
            continue
        parsed.calls.append(ToolCall(id=call_id, name=name, arguments_json=arguments_json))
    return parsed


def tool_response(results: list[tuple[str, str]]) -> str:
    """Assembles the environment's reply: (call id, output) pairs, errors included."""
    parts = [f"Results for tool call {call_id}:\n{output}" for call_id, output in results]
    return "<tool_response>\n" + "\n".join(parts) + "\n</tool_response>\n"


def tool_response_of(results) -> str:
    """The tool response for ToolResults: the output, or the error the model should read."""
    if not results:
        return ""
    return tool_response([(r.call_id, f"Error: {r.error}" if r.is_error else r.output.rstrip("\n")) for r in results])


def episode_prefix(mode: int, routing_rationale: str) -> str:
    """The assistant text before the first turn: rationale, classification block, mode opener.
    A forced mode's rationale is its injected justification, so both cases read the same."""
    head = f"{routing_rationale}\n" if routing_rationale else ""
    return head + classification_block(mode) + MODE_OPENERS[mode]


def render_transcript(trajectory) -> str:
    """Rebuilds the whole assistant turn of a stored trajectory, tool responses included."""
    parts = [episode_prefix(trajectory.mode, trajectory.routing_rationale)]
    for turn in trajectory.turns:
        parts.append(turn.output)
        parts.append(tool_response_of(turn.tool_results))
    return "".join(parts)


@dataclass
class AgenticStep:
    """What one agentic generation asked for."""

    answer: str | None = None
    plan: str | None = None
    summary: str | None = None
    calls: ParsedCalls | None = None


def parse_agentic_step(text: str, known_tools: set[str] | frozenset[str]) -> AgenticStep:
    """Reads one agentic step: an answer ends the episode, else the tool calls are run."""
    step = AgenticStep(plan=tag_content(text, "plan"), summary=tag_content(text, "summary"))
    call_start = text.rfind("<tool_call>")
    answer_start = text.rfind("<answer>")
    if answer_start > call_start:
        step.answer = tag_content(text, "answer")
    elif call_start >= 0:
        step.calls = parse_tool_calls(tag_content(text[call_start:], "tool_call") or "", known_tools)
    return step
