"""The reward service over real gRPC on loopback: Score, Price, CostOfPass and bad input."""

from __future__ import annotations

import contextlib
import math

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import TokenUsage, Trajectory
from gearshift.api.reward.v1 import reward_pb2, reward_pb2_grpc
from gearshift.clients import channel
from gearshift.server import running
from gearshift.services.reward.service import FULL_NAME, build
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import SecretStr

from tests.libs.rewards.chat_server import scripted_chat_server
from tests.libs.rewards.test_formulas import apo_group
from tests.libs.rewards.trajectories import AGENTIC, INSTANT, REASONING, rollout, with_tool_results

R = reward_pb2


@contextlib.asynccontextmanager
async def reward_service(settings):
    async with running(await build(settings), settings) as server:
        async with channel(f"127.0.0.1:{server.port}", settings) as ch:
            yield reward_pb2_grpc.RewardStub(ch), ch


async def expect(code, call, fragment: str):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == code, err.value.details()
    assert fragment in err.value.details()


async def test_score_an_apo_group(settings):
    group = apo_group()
    for index, member in enumerate(group):
        member.id = f"r{index}"
    async with reward_service(settings) as (stub, ch):
        health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=FULL_NAME))
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reply = await stub.Score(R.ScoreRequest(reference_answer="391", kind=R.REWARD_KIND_APO, rollouts=group))
    assert reply.forced_instant_success_rate == pytest.approx(2 / 3)
    assert [s.trajectory_id for s in reply.scored] == [f"r{i}" for i in range(10)]
    values = [s.reward.value for s in reply.scored]
    assert values == pytest.approx([1, 1, 0, 1, 1, 5 / 9, 5 / 9, 1, 0, 0])
    first = reply.scored[0]
    assert first.reward.verifier == "math" and first.reward.kind == "apo" and first.reward.format_valid
    # Each rollout: one turn of 100 input + 50 output tokens (agentic: two turns).
    assert first.cost.total_usd == pytest.approx(100 * 0.1e-6 + 50 * 0.4e-6)
    assert reply.scored[6].cost.total_usd == pytest.approx(2 * (100 * 0.1e-6 + 50 * 0.4e-6))


@pytest.mark.parametrize(
    ("verifier", "reference", "answers", "verdicts"),
    [
        (R.VERIFIER_F1, "Barack Obama", ["president Barack Obama", "Obama"], [True, False]),
        (R.VERIFIER_CHOICE, "C", ["The answer is (C).", "B"], [True, False]),
        (R.VERIFIER_NUMERIC, "1234.5", ["$1,234.50", "1235"], [True, False]),
        (R.VERIFIER_EXACT, "Paris", ["paris.", "Paris, France"], [True, False]),
        (R.VERIFIER_UNSPECIFIED, "\\frac{3}{4}", ["0.75", "3/5"], [True, False]),
    ],
)
async def test_score_with_each_verifier(settings, verifier, reference, answers, verdicts):
    request = R.ScoreRequest(reference_answer=reference, verifier=verifier, rollouts=[rollout(INSTANT, a) for a in answers])
    async with reward_service(settings) as (stub, _):
        reply = await stub.Score(request)
    assert [s.reward.correct for s in reply.scored] == verdicts
    assert [s.reward.value for s in reply.scored] == [float(v) for v in verdicts]
    assert reply.forced_instant_success_rate == -1


async def test_an_empty_answer_scores_zero(settings):
    empty = rollout(REASONING, "", outputs=("I ran out of budget.",))
    async with reward_service(settings) as (stub, _):
        reply = await stub.Score(R.ScoreRequest(reference_answer="391", kind=R.REWARD_KIND_SR2AM, rollouts=[empty]))
    reward = reply.scored[0].reward
    assert (reward.value, reward.correct, reward.format_valid) == (0.0, False, False)


async def test_price(settings):
    trajectory = with_tool_results(rollout(AGENTIC), ("python", 2.0), ("web_search", 0.0))
    trajectory.usage.CopyFrom(TokenUsage(input_tokens=1000, output_tokens=500))
    async with reward_service(settings) as (stub, _):
        cost = await stub.Price(R.PriceRequest(trajectory=trajectory))
    assert cost.tools_usd == pytest.approx(1e-4 + 1e-3)
    assert cost.sandbox_usd == pytest.approx(2.0 * 5e-5)
    assert cost.total_usd == pytest.approx(1e-4 + 2e-4 + 1.1e-3 + 1e-4)


async def test_cost_of_pass(settings):
    outcomes = [R.Outcome(cost_usd=c, correct=ok) for c, ok in [(0.01, True), (0.02, False), (0.03, True), (0.04, False)]]
    async with reward_service(settings) as (stub, _):
        reply = await stub.CostOfPass(R.CostOfPassRequest(outcomes=outcomes, seed=3))
        again = await stub.CostOfPass(R.CostOfPassRequest(outcomes=outcomes, seed=3))
        none = await stub.CostOfPass(R.CostOfPassRequest(outcomes=[R.Outcome(cost_usd=0.5)], bootstrap_samples=50))
    assert reply.cost_of_pass_usd == pytest.approx(0.05)  # 0.10 total / 2 correct
    assert (reply.attempts, reply.correct, reply.total_cost_usd) == (4, 2, pytest.approx(0.10))
    assert reply.ci_low_usd <= 0.05 <= reply.ci_high_usd
    assert again == reply  # seeded
    assert math.isinf(none.cost_of_pass_usd) and math.isinf(none.ci_high_usd)


async def test_bad_input_gets_invalid_argument(settings):
    small = settings.model_copy(
        update={"limits": settings.limits.model_copy(update={"max_answer_chars": 1000}),
                "reward": settings.reward.model_copy(update={"max_group_size": 4})}
    )
    bad = grpc.StatusCode.INVALID_ARGUMENT
    good = rollout(INSTANT, "391")
    unknown_mode = rollout(INSTANT)
    unknown_mode.mode = 7
    no_mode = rollout(INSTANT)
    no_mode.mode = 0
    async with reward_service(small) as (stub, _):
        await expect(bad, stub.Score(R.ScoreRequest(reference_answer=" ", rollouts=[good])), "reference_answer is empty")
        await expect(bad, stub.Score(R.ScoreRequest(reference_answer="x" * 1001, rollouts=[good])), "reference_answer longer than 1000")
        await expect(bad, stub.Score(R.ScoreRequest(reference_answer="391", rollouts=[rollout(INSTANT, "9" * 1001)])), "rollout 0: answer longer than 1000")
        huge_turn = rollout(INSTANT, "", outputs=("<answer>" + "9" * 1001 + "</answer>",))
        await expect(bad, stub.Score(R.ScoreRequest(reference_answer="391", rollouts=[huge_turn])), "answer longer than 1000")
        await expect(bad, stub.Score(R.ScoreRequest(reference_answer="391")), "no rollouts")
        await expect(bad, stub.Score(R.ScoreRequest(reference_answer="391", rollouts=[good] * 5)), "at most 4")
        await expect(bad, stub.Score(R.ScoreRequest(reference_answer="391", verifier=42, rollouts=[good])), "unknown verifier 42")
        await expect(bad, stub.Score(R.ScoreRequest(reference_answer="391", kind=9, rollouts=[good])), "unknown reward kind 9")
        await expect(bad, stub.Score(R.ScoreRequest(reference_answer="391", rollouts=[good, unknown_mode])), "rollout 1: unknown mode 7")
        await expect(bad, stub.Score(R.ScoreRequest(reference_answer="391", kind=R.REWARD_KIND_APO, rollouts=[no_mode])), "APO needs the mode")
        negative = with_tool_results(rollout(INSTANT), ("python", -1.0))
        await expect(bad, stub.Price(R.PriceRequest(trajectory=negative)), "cpu_seconds -1.0")
        await expect(bad, stub.Score(R.ScoreRequest(reference_answer="391", rollouts=[negative])), "rollout 0: turn 0")
        negative_tokens = Trajectory(usage=TokenUsage(input_tokens=-3))
        await expect(bad, stub.Price(R.PriceRequest(trajectory=negative_tokens)), "non-negative")
        await expect(bad, stub.CostOfPass(R.CostOfPassRequest()), "no outcomes")
        await expect(bad, stub.CostOfPass(R.CostOfPassRequest(outcomes=[R.Outcome(cost_usd=-0.01, correct=True)])), "outcome 0 has cost -0.01")
        await expect(bad, stub.CostOfPass(R.CostOfPassRequest(outcomes=[R.Outcome(cost_usd=math.nan)])), "outcome 0 has cost nan")
        await expect(bad, stub.CostOfPass(R.CostOfPassRequest(outcomes=[R.Outcome(cost_usd=1)], confidence=1.5)), "confidence")
        await expect(bad, stub.CostOfPass(R.CostOfPassRequest(outcomes=[R.Outcome(cost_usd=1)], bootstrap_samples=-1)), "bootstrap_samples")
        # Still serving normally after all of that.
        reply = await stub.Score(R.ScoreRequest(reference_answer="391", rollouts=[good]))
        assert reply.scored[0].reward.correct


def _length_delimited(field: int, payload: bytes) -> bytes:
    assert len(payload) < 128
    return bytes([field << 3 | 2, len(payload)]) + payload


@pytest.mark.parametrize(
    ("method", "payload"),
    [
        # ScoreRequest.reference_answer = b"\xff\xfe"
        ("Score", _length_delimited(1, b"\xff\xfe")),
        # ScoreRequest.rollouts[0].answer = b"39\xc3" (a truncated UTF-8 sequence)
        ("Score", _length_delimited(1, b"391") + _length_delimited(4, _length_delimited(8, b"39\xc3"))),
        # PriceRequest.trajectory.turns[0].output = b"\x80"
        ("Price", _length_delimited(1, _length_delimited(7, _length_delimited(4, b"\x80")))),
    ],
)
async def test_non_utf8_strings_get_a_clear_status(settings, method, payload):
    async with reward_service(settings) as (stub, ch):
        raw = ch.unary_unary(f"/{FULL_NAME}/{method}", request_serializer=None, response_deserializer=None)
        await expect(grpc.StatusCode.INVALID_ARGUMENT, raw(payload), "bad UTF-8")
        reply = await stub.Score(R.ScoreRequest(reference_answer="391", rollouts=[rollout()]))
        assert reply.scored[0].reward.correct


async def test_the_judge_is_off_by_default(settings):
    request = R.ScoreRequest(reference_answer="Paris", verifier=R.VERIFIER_JUDGE, rollouts=[rollout(INSTANT, "Paris")])
    async with reward_service(settings) as (stub, _):
        await expect(grpc.StatusCode.FAILED_PRECONDITION, stub.Score(request), "JUDGE_ENABLED")


async def test_the_judge_when_enabled(settings):
    def respond(prompt: str) -> str:
        verdict = "correct" if "Answer to grade: the city of Paris" in prompt else "incorrect"
        return f'{{"rationale": "compared with Paris", "judgement": "{verdict}"}}'

    with scripted_chat_server(respond) as (url, requests):
        client = settings.policy_client.model_copy(update={"url": url, "api_key": SecretStr("policy-key")})
        judged = settings.model_copy(
            update={"policy_client": client, "reward": settings.reward.model_copy(update={"judge_enabled": True})}
        )
        group = [rollout(INSTANT, "the city of Paris"), rollout(INSTANT, "Lyon"), rollout(INSTANT, "the city of Paris")]
        async with reward_service(judged) as (stub, _):
            reply = await stub.Score(R.ScoreRequest(reference_answer="Paris", verifier=R.VERIFIER_JUDGE, rollouts=group))
    assert [s.reward.correct for s in reply.scored] == [True, False, True]
    assert {s.reward.verifier for s in reply.scored} == {"judge"}
    assert len(requests) == 2  # the repeated answer was judged once
    assert {r["authorization"] for r in requests} == {"Bearer policy-key"}
