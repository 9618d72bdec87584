"""The optional LLM judge (A^2FM): the policy server's OpenAI-compatible chat API grades an
answer against the reference and replies with JSON {"rationale": ..., "judgement": "correct" |
"incorrect"}. Off unless Settings.reward.judge_enabled."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import httpx

from gearshift.errors import Unavailable

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
    """Grades answers through POST {base_url}/chat/completions."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, model: str, max_tokens: int, api_key: str | None = None):
        self.client = client
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.max_tokens = max_tokens
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def judge(self, question: str, answer: str, reference: str) -> JudgeVerdict:
        """One greedy judgement; raises Unavailable when the server or its reply fails."""
        prompt = JUDGE_PROMPT.format(question=question, reference=reference, answer=answer)
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0.0,
            "max_tokens": self.max_tokens,
        }
        try:
            response = await self.client.post(self.url, json=body, headers=self.headers)
            response.raise_for_status()
            content = response.json()["choices"][0]["message"]["content"] or ""
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise Unavailable(f"the LLM judge at {self.url} failed: {exc}") from exc
        try:
            return parse_verdict(content)
        except JudgeReplyError as exc:
            raise Unavailable(f"the LLM judge replied out of format: {exc}") from exc
