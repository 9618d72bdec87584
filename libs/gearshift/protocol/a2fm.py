"""The A^2FM text protocol as the platform writes it: the classification block, the prefixes and
openers the executor injects, the tool responses, the transcript of a stored trajectory. The
text is read by gearshift.protocol.parsers (the a2fm format) and nowhere else."""

from __future__ import annotations

import re
from collections.abc import Sequence

from gearshift.api.common.v1.common_pb2 import Mode, Turn
from gearshift.protocol.parsers.a2fm import tag_content
from gearshift.protocol.prompts import MODE_OPENERS

LABELS = {
    "default_agent": Mode.MODE_INSTANT,
    "reasoning_agent": Mode.MODE_REASONING,
    "toolcalling_agent": Mode.MODE_AGENTIC,
}
LABEL_OF = {mode: label for label, mode in LABELS.items()}

CLASSIFICATION_STOP = "</classification>"
# What the executor writes when an agentic turn ends with neither a call nor an answer, or when
# the steps run out (ExecutorSettings.answer_at_step_limit).
FORCED_ANSWER_OPENER = "\n<answer>"
REJECTED_CALL_PREFIX = "rejected-"  # the call id of a tool result that tells the model its call did not parse

# The one-sentence justification injected before a forced classification block.
FORCED_JUSTIFICATION = {
    Mode.MODE_INSTANT: "This question can be answered directly.",
    Mode.MODE_REASONING: "This question needs careful step-by-step reasoning.",
    Mode.MODE_AGENTIC: "This question needs tools to answer reliably.",
}

_LABEL = re.compile("|".join(LABELS))


def classification_block(mode: int) -> str:
    return f"<classification>\n{LABEL_OF[mode]}\n</classification>\n"


def forced_prefix(mode: int) -> str:
    """The assistant-turn start that pins a mode (A^2FM prefix injection)."""
    return f"{FORCED_JUSTIFICATION[mode]}\n{classification_block(mode)}"


def parse_classification(text: str) -> tuple[int | None, str]:
    """Returns (mode or None when the label is missing or unknown, rationale before the block)."""
    at = text.find("<classification>")
    if at < 0:
        return None, text.strip()
    label = _LABEL.search((tag_content(text[at:], "classification") or "").lower())  # tolerant: "default_agent: answer directly" counts
    return (LABELS[label.group(0)] if label else None), text[:at].strip()


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
