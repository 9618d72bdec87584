"""The LLM judge: its A^2FM JSON verdict, and a real HTTP round trip on loopback."""

from __future__ import annotations

import pytest
from gearshift.errors import Unavailable
from gearshift.policy_client import PolicyClient
from gearshift.rewards.judge import JudgeReplyError, LLMJudge, parse_verdict

from tests.libs.rewards.chat_server import scripted_chat_server


@pytest.mark.parametrize(
    ("reply", "correct"),
    [
        ('{"rationale": "Same city.", "judgement": "correct"}', True),
        ('{"rationale": "Different.", "judgement": "incorrect"}', False),
        ('```json\n{"rationale": "ok", "judgement": "Correct"}\n```', True),
        ('Here is my verdict: {"judgement": "incorrect", "rationale": "no"} Thanks.', False),
    ],
)
def test_verdicts(reply, correct):
    assert parse_verdict(reply).correct is correct


@pytest.mark.parametrize("reply", ["correct", '{"judgement": "maybe"}', '{"judgement": correct}', "[1, 2]"])
def test_replies_out_of_format(reply):
    with pytest.raises(JudgeReplyError):
        parse_verdict(reply)


async def test_judge_over_http():
    replies = iter(['{"rationale": "Both name Paris.", "judgement": "correct"}', "I am not sure.", 503])
    with scripted_chat_server(lambda prompt: next(replies)) as (url, requests):
        async with PolicyClient(url, "policy-model", timeout=5, retries=0) as client:
            judge = LLMJudge(client, max_tokens=64, model="judge-model")
            verdict = await judge.judge("Capital of France?", "It is Paris.", "Paris")
            assert verdict.correct and verdict.rationale == "Both name Paris."
            with pytest.raises(Unavailable, match="out of format"):
                await judge.judge("Capital of France?", "Lyon", "Paris")
            with pytest.raises(Unavailable, match="503"):
                await judge.judge("Capital of France?", "Lyon", "Paris")
    sent = requests[0]
    assert sent["path"] == "/v1/chat/completions" and sent["authorization"] is None
    assert sent["body"]["model"] == "judge-model" and sent["body"]["temperature"] == 0.0
    prompt = sent["body"]["messages"][0]["content"]
    assert "It is Paris." in prompt and '"judgement"' in prompt
