"""Planner servicer: protobuf <-> SimulativePlanner."""

from __future__ import annotations

from gearshift.api.common.v1.common_pb2 import TokenUsage
from gearshift.api.planner.v1 import planner_pb2, planner_pb2_grpc
from gearshift.errors import InvalidArgument
from gearshift.policy_client import requested_sampling, sampling_options
from gearshift.protocol import prompts
from gearshift.services.planner.core import Belief, SimulativePlanner
from gearshift.settings import Limits


class PlannerServicer(planner_pb2_grpc.PlannerServicer):
    def __init__(self, planner: SimulativePlanner, limits: Limits):
        self.planner = planner
        self.limits = limits

    def _belief(self, state: planner_pb2.BeliefState) -> Belief:
        if len(state.query) > self.limits.max_query_chars:
            raise InvalidArgument(f"query longer than {self.limits.max_query_chars} characters")
        if len(state.history) > self.limits.max_turns:
            raise InvalidArgument(f"history longer than {self.limits.max_turns} turns")
        if len(state.transcript) > self.limits.max_query_chars * 8:
            raise InvalidArgument(f"transcript longer than {self.limits.max_query_chars * 8} characters")
        prompts.check_conversation(state.conversation, self.limits.max_query_chars * 8)
        return Belief(state.query, list(state.history), state.current_plan, state.plan_progress, state.transcript,
                      state.conversation)

    async def Regulate(self, request: planner_pb2.RegulateRequest, context) -> planner_pb2.RegulateResponse:
        decision = await self.planner.regulate(self._belief(request.state), sampling_options(requested_sampling(request)))
        return planner_pb2.RegulateResponse(
            decision=decision.decision,
            rationale=decision.rationale,
            usage=TokenUsage(input_tokens=decision.input_tokens, output_tokens=decision.output_tokens),
            sampled=decision.sampled,
        )

    async def Plan(self, request: planner_pb2.PlanRequest, context) -> planner_pb2.PlanResponse:
        if request.max_horizon < 0:
            raise InvalidArgument("max_horizon must not be negative")
        result = await self.planner.plan(self._belief(request.state), request.max_horizon, sampling_options(requested_sampling(request)))
        return planner_pb2.PlanResponse(
            plan=result.plan,
            text=result.text,
            usage=TokenUsage(input_tokens=result.input_tokens, output_tokens=result.output_tokens),
            sampled=result.sampled,
        )
