"""A^2FM format validity per mode, judged on a trajectory's turn outputs (docs/protocol.md, section 3).

- instant: only <answer>...</answer>;
- reasoning: <reasoning>...</reasoning> then <answer>...</answer>;
- agentic: <plan> first (free thinking text, such as an SR2AM "Plan:" block, may come before
  it), then steps of free text, <summary> and <tool_call> blocks (one Python
  dict literal per line, 1-10 per block), and one <answer> at the very end.

A leading routing rationale and <classification> block is allowed and must name the mode.
Generation stops at </tool_call> and </answer>, so an unclosed one of those at the end of a
turn counts as closed there. Tool responses the environment appended are ignored.

A native trajectory (gearshift.protocol.native) has no tags: its format is a well-formed native
episode (check_native_format).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass

from gearshift.api.common.v1.common_pb2 import Mode, Trajectory
from gearshift.protocol import native
from gearshift.protocol.a2fm import LABELS, MAX_PARALLEL_CALLS, answer_was_asked, render_transcript, tag_content

TAGS = ("classification", "answer", "reasoning", "plan", "tool_call", "tool_response", "summary")
_TAG = re.compile(rf"<(/?)({'|'.join(TAGS)})>")
_STOP_WORD_TAGS = ("answer", "tool_call")
_LITERAL_ERRORS = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError)


@dataclass(frozen=True)
class Block:
    """A tagged block, or free text between blocks (tag None)."""

    tag: str | None
    content: str


@dataclass(frozen=True)
class FormatCheck:
    """The verdict, and for an invalid format the first reason found."""

    valid: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.valid


class FormatError(ValueError):
    """The text's tags do not form a flat sequence of closed blocks."""


def split_blocks(text: str) -> list[Block]:
    """Splits one generation into tagged blocks and free text; tags must not nest."""
    blocks: list[Block] = []
    position, open_tag, open_at = 0, None, 0
    for match in _TAG.finditer(text):
        closing, tag = match.group(1) == "/", match.group(2)
        if open_tag is None:
            if closing:
                raise FormatError(f"</{tag}> without <{tag}>")
            blocks.append(Block(None, text[position : match.start()]))
            open_tag, open_at = tag, match.end()
        elif closing and tag == open_tag:
            blocks.append(Block(tag, text[open_at : match.start()]))
            open_tag = None
        else:
            raise FormatError(f"<{match.group(1)}{tag}> inside <{open_tag}>")
        position = match.end()
    if open_tag is not None:
        if open_tag not in _STOP_WORD_TAGS:
            raise FormatError(f"<{open_tag}> is never closed")
        blocks.append(Block(open_tag, text[open_at:]))  # cut by its stop word
    else:
        blocks.append(Block(None, text[position:]))
    return [b for b in blocks if b.tag is not None or b.content.strip()]


def tool_call_problem(content: str) -> str | None:
    """Why a <tool_call> block does not parse, or None when every line is a valid call."""
    lines = [line.strip().rstrip(",") for line in content.splitlines() if line.strip()]
    if not lines:
        return "empty <tool_call> block"
    if len(lines) > MAX_PARALLEL_CALLS:
        return f"{len(lines)} calls in one block (at most {MAX_PARALLEL_CALLS})"
    for number, line in enumerate(lines, start=1):
        try:
            call = ast.literal_eval(line)
        except _LITERAL_ERRORS:
            return f"tool call line {number} is not a Python literal"
        if not isinstance(call, dict):
            return f"tool call line {number} is not a dict"
        if not isinstance(call.get("name"), str) or not call["name"]:
            return f"tool call line {number} has no tool name"
        if not isinstance(call.get("arguments"), dict):
            return f"tool call line {number} has no arguments dict"
    return None


def check_format(mode: int, outputs: Sequence[str]) -> FormatCheck:
    """Whether the turn outputs of one trajectory follow the mode's A^2FM format."""
    if mode not in _MODE_RULES:
        return FormatCheck(False, "no mode")
    if not outputs:
        return FormatCheck(False, "no turns")
    try:
        blocks = [block for output in outputs for block in split_blocks(output)]
    except FormatError as exc:
        return FormatCheck(False, str(exc))
    blocks = _without_routing(blocks, mode)
    if isinstance(blocks, FormatCheck):
        return blocks
    blocks = [b for b in blocks if b.tag != "tool_response"]
    if not blocks or blocks[-1].tag != "answer":
        return FormatCheck(False, "does not end with <answer>")
    if not blocks[-1].content.strip():
        return FormatCheck(False, "empty <answer>")
    return _MODE_RULES[mode](blocks)


def check_trajectory_format(trajectory: Trajectory) -> FormatCheck:
    """check_format on the whole assistant turn as the policy saw it: the routing prefix and
    mode opener the executor injected, every turn's output and the tool responses."""
    if not trajectory.turns:
        return FormatCheck(False, "no turns")
    if answer_was_asked(trajectory.turns):  # the answer counts; the format was not the policy's own
        return FormatCheck(False, "the executor asked for the answer")
    if native.is_native(trajectory):
        return check_native_format(trajectory)
    return check_format(trajectory.mode, [render_transcript(trajectory)])


def check_native_format(trajectory: Trajectory) -> FormatCheck:
    """Whether a native trajectory is a well-formed native episode of its mode: it ends with an
    assistant message without tool calls whose content is the answer; instant mode is that one
    message and no reasoning, reasoning mode one message with its reasoning; in agentic mode each
    turn before the answer calls tools, and every call is well-formed (a tool that was offered,
    arguments a JSON object, at most MAX_PARALLEL_CALLS a turn: none the platform refused)."""
    turns = trajectory.turns
    if trajectory.mode not in _MODE_RULES:
        return FormatCheck(False, "no mode")
    if not turns:
        return FormatCheck(False, "no turns")
    if turns[-1].tool_calls or not turns[-1].output.strip():
        return FormatCheck(False, "does not end with an answer (a message with content and no tool calls)")
    if trajectory.mode != Mode.MODE_AGENTIC:
        if len(turns) != 1:
            return FormatCheck(False, f"{len(turns)} messages in a mode that answers in one")
        has_reasoning = bool(turns[0].reasoning_content.strip())
        if trajectory.mode == Mode.MODE_INSTANT and has_reasoning:
            return FormatCheck(False, "instant mode answers without reasoning")
        if trajectory.mode == Mode.MODE_REASONING and not has_reasoning:
            return FormatCheck(False, "reasoning mode reasons before it answers")
        return FormatCheck(True)
    for position, turn in enumerate(turns[:-1]):
        if not turn.tool_calls:
            return FormatCheck(False, f"turn {position} neither calls a tool nor ends the episode")
        refusals = [result.error for result in turn.tool_results if native.refused(result)]
        if refusals:
            return FormatCheck(False, f"turn {position}: {refusals[0]}")
    return FormatCheck(True)


def final_answer(trajectory: Trajectory) -> str:
    """The trajectory's answer: its answer field, else the last <answer> in its turns; tags
    around the answer are removed. "" when there is none."""
    answer = trajectory.answer
    if answer.strip():
        return (tag_content(answer, "answer") or "") if "<answer>" in answer else answer.strip()
    for turn in reversed(trajectory.turns):
        if "<answer>" in turn.output:
            return tag_content(turn.output, "answer") or ""
    return ""


def _without_routing(blocks: list[Block], mode: int) -> list[Block] | FormatCheck:
    """Drops a leading rationale + <classification> block after checking its label."""
    for index, block in enumerate(blocks):
        if block.tag == "classification":
            if index > 1 or (index == 1 and blocks[0].tag is not None):
                return FormatCheck(False, "<classification> after other blocks")
            label = LABELS.get(block.content.strip().lower())
            if label != mode:
                return FormatCheck(False, f"classification {block.content.strip()!r} does not name the mode")
            return blocks[index + 1 :]
    return blocks


def _instant(blocks: list[Block]) -> FormatCheck:
    if len(blocks) != 1:
        return FormatCheck(False, "instant mode allows only <answer>")
    return FormatCheck(True)


def _reasoning(blocks: list[Block]) -> FormatCheck:
    if [b.tag for b in blocks] != ["reasoning", "answer"]:
        return FormatCheck(False, "reasoning mode needs <reasoning> then <answer> and nothing else")
    if not blocks[0].content.strip():
        return FormatCheck(False, "empty <reasoning>")
    return FormatCheck(True)


def _agentic(blocks: list[Block]) -> FormatCheck:
    tagged = [b for b in blocks if b.tag is not None]  # free text (thinking, SR2AM "Plan:") may lead
    if tagged[0].tag != "plan":
        return FormatCheck(False, "agentic mode starts with <plan>")
    if not tagged[0].content.strip():
        return FormatCheck(False, "empty <plan>")
    for block in blocks[blocks.index(tagged[0]) + 1 : -1]:
        if block.tag not in (None, "plan", "summary", "tool_call"):
            return FormatCheck(False, f"<{block.tag}> in the middle of an agentic trajectory")
        if block.tag == "tool_call":
            problem = tool_call_problem(block.content)
            if problem:
                return FormatCheck(False, problem)
    return FormatCheck(True)


_MODE_RULES = {Mode.MODE_INSTANT: _instant, Mode.MODE_REASONING: _reasoning, Mode.MODE_AGENTIC: _agentic}
