"""Reward servicer: protobuf <-> RewardScorer."""

from __future__ import annotations

from gearshift.api.common.v1.common_pb2 import Cost, Mode, PlanDecision, RoutingStrategy, Trajectory, TrajectoryStatus
from gearshift.api.reward.v1 import reward_pb2, reward_pb2_grpc
from gearshift.errors import InvalidArgument
from gearshift.rewards import scoring, verifiers
from gearshift.services.reward.core import RewardScorer

VERIFIERS = {
    reward_pb2.VERIFIER_UNSPECIFIED: None,
    reward_pb2.VERIFIER_MATH: verifiers.MATH,
    reward_pb2.VERIFIER_EXACT: verifiers.EXACT,
    reward_pb2.VERIFIER_PHRASE: verifiers.PHRASE,
    reward_pb2.VERIFIER_F1: verifiers.F1,
    reward_pb2.VERIFIER_CHOICE: verifiers.CHOICE,
    reward_pb2.VERIFIER_NUMERIC: verifiers.NUMERIC,
    reward_pb2.VERIFIER_JUDGE: verifiers.JUDGE,
}
KINDS = {
    reward_pb2.REWARD_KIND_UNSPECIFIED: scoring.CORRECTNESS,
    reward_pb2.REWARD_KIND_APO: scoring.APO,
    reward_pb2.REWARD_KIND_SR2AM: scoring.SR2AM,
}
NO_RATE = -1.0  # forced_instant_success_rate when the group has no forced-instant rollout


class RewardServicer(reward_pb2_grpc.RewardServicer):
    def __init__(self, scorer: RewardScorer):
        self.scorer = scorer

    async def Score(self, request: reward_pb2.ScoreRequest, context) -> reward_pb2.ScoreResponse:
        if request.verifier not in VERIFIERS:
            raise InvalidArgument(f"unknown verifier {request.verifier}")
        if request.kind not in KINDS:
            raise InvalidArgument(f"unknown reward kind {request.kind}")
        for index, rollout in enumerate(request.rollouts):
            check_enums(rollout, f"rollout {index}: ")
        scored = await self.scorer.score(
            request.reference_answer, VERIFIERS[request.verifier], KINDS[request.kind], request.rollouts
        )
        p = scored.score.forced_instant_success_rate
        return reward_pb2.ScoreResponse(
            scored=[
                reward_pb2.ScoredRollout(trajectory_id=rollout.id, reward=reward, cost=cost, judge_usage=usage)
                for rollout, reward, cost, usage in zip(request.rollouts, scored.score.rewards, scored.costs, scored.judge_usage)
            ],
            forced_instant_success_rate=NO_RATE if p is None else p,
        )

    async def Price(self, request: reward_pb2.PriceRequest, context) -> Cost:
        check_enums(request.trajectory, "")
        return self.scorer.price(request.trajectory)

    async def CostOfPass(self, request: reward_pb2.CostOfPassRequest, context) -> reward_pb2.CostOfPassResponse:
        result = await self.scorer.cost_of_pass(
            [o.cost_usd for o in request.outcomes],
            [o.correct for o in request.outcomes],
            request.bootstrap_samples,
            request.confidence,
            request.seed,
            [o.item_id or str(i) for i, o in enumerate(request.outcomes)],
        )
        return reward_pb2.CostOfPassResponse(
            cost_of_pass_usd=result.cost_of_pass_usd,
            ci_low_usd=result.ci_low_usd,
            ci_high_usd=result.ci_high_usd,
            attempts=result.attempts,
            correct=result.correct,
            total_cost_usd=result.total_cost_usd,
        )


def check_enums(trajectory: Trajectory, where: str) -> None:
    """Proto3 enums are open: a number the schema does not name arrives as is, so refuse it."""
    for field, enum in (("mode", Mode), ("requested_mode", Mode), ("routing_strategy", RoutingStrategy), ("status", TrajectoryStatus)):
        value = getattr(trajectory, field)
        if value not in enum.values():
            raise InvalidArgument(f"{where}unknown {field} {value}")
    for turn in trajectory.turns:
        if turn.plan_decision not in PlanDecision.values():
            raise InvalidArgument(f"{where}turn {turn.index}: unknown plan_decision {turn.plan_decision}")
