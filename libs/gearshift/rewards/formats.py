"""A^2FM format validity per mode, judged on a trajectory's turn outputs (docs/protocol.md, section 3).

- instant: only <answer>...</answer>;
- reasoning: <reasoning>...</reasoning> then <answer>...</answer>;
- agentic: <plan> first (free thinking text, such as an SR2AM "Plan:" block, may come before
  it), then steps of free text, <summary> and <tool_call> blocks (every line a call in the one
  grammar the executor runs, gearshift.protocol.parsers.calls; 1-10 per block), and one
  <answer> at the very end.

A leading routing rationale and <classification> block is allowed and must name the mode.
Generation stops at </tool_call> and </answer>, so an unclosed one of those at the end of a
turn counts as closed there. Tool responses the environment appended are ignored.

A native trajectory (gearshift.protocol.native) has no tags: its format is a well-formed native
episode (check_native_format).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gearshift.api.common.v1.common_pb2 import Mode, Trajectory
from gearshift.protocol import native
from gearshift.protocol.a2fm import LABELS, answer_was_asked, render_transcript
from gearshift.protocol.parsers import calls
from gearshift.protocol.parsers.a2fm import FormatError, TextBlock, blocks, tag_content


@dataclass(frozen=True)
class FormatCheck:
    """The verdict, and for an invalid format the first reason found."""

    valid: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.valid


def tool_call_problem(content: str) -> str | None:
    """Why a <tool_call> block is no well-formed block of calls, or None when every line is one."""
    block = calls.read_block(content)
    if block.problems:
        return block.problems[0]
    if len(block.calls) > calls.MAX_PARALLEL_CALLS:
        return f"{len(block.calls)} calls in one block (at most {calls.MAX_PARALLEL_CALLS})"
    return None


def check_format(mode: int, outputs: Sequence[str]) -> FormatCheck:
    """Whether the turn outputs of one trajectory follow the mode's A^2FM format."""
    if mode not in _MODE_RULES:
        return FormatCheck(False, "no mode")
    if not outputs:
        return FormatCheck(False, "no turns")
    try:
        found = [block for output in outputs for block in blocks(output)]
    except FormatError as exc:
        return FormatCheck(False, str(exc))
    found = _without_routing(found, mode)
    if isinstance(found, FormatCheck):
        return found
    found = [b for b in found if b.tag != "tool_response"]
    if not found or found[-1].tag != "answer":
        return FormatCheck(False, "does not end with <answer>")
    if not found[-1].content.strip():
        return FormatCheck(False, "empty <answer>")
    return _MODE_RULES[mode](found)


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


def _without_routing(blocks: list[TextBlock], mode: int) -> list[TextBlock] | FormatCheck:
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


def _instant(blocks: list[TextBlock]) -> FormatCheck:
    if len(blocks) != 1:
        return FormatCheck(False, "instant mode allows only <answer>")
    return FormatCheck(True)


def _reasoning(blocks: list[TextBlock]) -> FormatCheck:
    if [b.tag for b in blocks] != ["reasoning", "answer"]:
        return FormatCheck(False, "reasoning mode needs <reasoning> then <answer> and nothing else")
    if not blocks[0].content.strip():
        return FormatCheck(False, "empty <reasoning>")
    return FormatCheck(True)


def _agentic(blocks: list[TextBlock]) -> FormatCheck:
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
