"""The optional LLM judge (A^2FM): the policy server's OpenAI-compatible chat API grades an
answer against the reference and replies with JSON {"rationale": ..., "judgement": "correct" |
"incorrect"}. Off unless Settings.reward.judge_enabled."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from gearshift.errors import Unavailable
from gearshift.policy_client import PolicyClient, Usage

JUDGE_PROMPT = """You are grading an answer to a question against the reference answer.
Judge only whether the answer means the same as the reference; ignore style and extra detail
unless it contradicts the reference.

Question: {question}
Reference answer: {reference}
Answer to grade: {answer}

Reply with a JSON object and nothing else:
{{"rationale": "<one or two sentences>", "judgement": "correct" or "incorrect"}}"""

_OBJECT = re.compile(r"\{.*\}", re.S)


@dataclass(frozen=True)
class JudgeVerdict:
    """The judge's decision and its stated reason."""

    correct: bool
    rationale: str
    usage: Usage = field(default_factory=Usage)  # the judge's own tokens (priced with the episode)


class JudgeReplyError(ValueError):
    """The judge's reply is not the JSON verdict asked for."""


def parse_verdict(reply: str) -> JudgeVerdict:
    """Reads {"rationale": ..., "judgement": "correct" | "incorrect"} from the judge's reply,
    tolerating text or a code fence around the object."""
    match = _OBJECT.search(reply)
    if not match:
        raise JudgeReplyError("no JSON object in the judge's reply")
    try:
        verdict = json.loads(match.group(0))
    except ValueError as exc:
        raise JudgeReplyError(f"the judge's JSON does not parse: {exc}") from exc
    judgement = str(verdict.get("judgement", "")).strip().lower() if isinstance(verdict, dict) else ""
    if judgement not in ("correct", "incorrect"):
        raise JudgeReplyError(f"judgement must be 'correct' or 'incorrect', got {judgement!r}")
    return JudgeVerdict(judgement == "correct", str(verdict.get("rationale", "")))


class LLMJudge:
    """Grades answers through the policy client's chat API (model: the client's, unless named)."""

    def __init__(self, policy: PolicyClient, max_tokens: int, model: str | None = None):
        self.policy = policy
        self.max_tokens = max_tokens
        self.model = model

    async def judge(self, question: str, answer: str, reference: str) -> JudgeVerdict:
        """One greedy judgement; raises Unavailable when the server or its reply fails."""
        prompt = JUDGE_PROMPT.format(question=question, reference=reference, answer=answer)
        named = {"model": self.model} if self.model else {}
        reply = await self.policy.chat([{"role": "user", "content": prompt}], max_tokens=self.max_tokens, temperature=0.0, **named)
        try:
            verdict = parse_verdict(reply.content or "")
        except JudgeReplyError as exc:
            raise Unavailable(f"the LLM judge replied out of format: {exc}") from exc
        return JudgeVerdict(verdict.correct, verdict.rationale, reply.usage)
