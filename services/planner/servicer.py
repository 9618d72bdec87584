"""Planner servicer: protobuf <-> SimulativePlanner."""

from __future__ import annotations

import json

from gearshift.api.planner.v1 import planner_pb2, planner_pb2_grpc
from gearshift.errors import InvalidArgument
from gearshift.protocol import prompts
from gearshift.sampling import requested_sampling, sampling_options
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
                      state.conversation, native_messages(state, self.limits.max_query_chars * 8),
                      state.native if state.HasField("native") else None)

    async def Regulate(self, request: planner_pb2.RegulateRequest, context) -> planner_pb2.RegulateResponse:
        decision = await self.planner.regulate(self._belief(request.state), sampling_options(requested_sampling(request)))
        return planner_pb2.RegulateResponse(
            decision=decision.decision,
            rationale=decision.rationale,
            usage=decision.usage,
            sampled=decision.sampled,
        )

    async def Plan(self, request: planner_pb2.PlanRequest, context) -> planner_pb2.PlanResponse:
        if request.max_horizon < 0:
            raise InvalidArgument("max_horizon must not be negative")
        result = await self.planner.plan(self._belief(request.state), request.max_horizon, sampling_options(requested_sampling(request)))
        return planner_pb2.PlanResponse(
            plan=result.plan,
            text=result.text,
            usage=result.usage,
            sampled=result.sampled,
        )


def native_messages(state: planner_pb2.BeliefState, max_chars: int) -> list[dict]:
    """BeliefState.native_messages_json read: chat messages ending with an assistant message."""
    if not state.native_messages_json:
        return []
    if len(state.native_messages_json) > max_chars:
        raise InvalidArgument(f"native_messages_json longer than {max_chars} characters")
    try:
        messages = json.loads(state.native_messages_json)
    except ValueError as exc:
        raise InvalidArgument(f"native_messages_json is not JSON: {exc}") from None
    if not (isinstance(messages, list) and messages and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)):
        raise InvalidArgument("native_messages_json must be a list of chat messages, each with a role")
    if messages[-1]["role"] != "assistant" or not isinstance(messages[-1].get("content") or "", str):
        raise InvalidArgument("native_messages_json must end with the assistant message the plan block opens")
    return messages
