"""POST /v1/feedback: a client's verdict on an answer it was served becomes the trajectory's
reward (store.SetReward), marked as feedback (gearshift.rewards.feedback) so that training can
select it. A reward in [0, 1] or a plain correct / incorrect is stored as given; a reference
answer is graded by the reward service (Score) against the stored trajectory."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass

import grpc
from gearshift.api.common.v1.common_pb2 import Reward, Trajectory
from gearshift.api.reward.v1 import reward_pb2, reward_pb2_grpc
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.interceptors import request_id
from gearshift.rewards.feedback import feedback_verifier
from gearshift.rewards.formats import check_trajectory_format
from gearshift.rewards.scoring import CORRECTNESS
from gearshift.openai_http import ApiError
from gearshift.services.gateway.api_keys import LABEL
from gearshift.services.gateway.errors import from_rpc
from gearshift.services.gateway.schemas import FeedbackRequest
from google.protobuf.json_format import MessageToDict

FEEDBACK_KIND = "feedback"  # Reward.kind of a reward value the client gave (no formula made it)


@dataclass
class FeedbackDesk:
    store: store_pb2_grpc.TrajectoryStoreStub
    reward: reward_pb2_grpc.RewardStub
    correct_at: float  # a reward at or above this counts as correct
    max_answer_chars: int
    timeout_seconds: float

    async def submit(self, body: FeedbackRequest, caller: str) -> dict:
        """Sets the reward of a trajectory served to the caller's API key (caller: its name)."""
        trajectory_id = _canonical_id(body.trajectory_id)
        given = [name for name in ("reward", "correct", "reference_answer") if getattr(body, name) is not None]
        if len(given) != 1:
            raise ApiError(400, "give exactly one of reward, correct and reference_answer", given[1] if len(given) > 1 else None)
        self._check(body)
        trajectory = await self._trajectory(trajectory_id)
        if not _served_to(trajectory, caller):
            raise ApiError(403, f"trajectory {trajectory_id} was not served to this API key: only its own key may give feedback on it",
                           "trajectory_id")
        reward = await self._graded(trajectory, body.reference_answer) if body.reference_answer is not None else self._given(trajectory, body)
        try:
            reply = await self.store.SetReward(store_pb2.SetRewardRequest(id=trajectory_id, reward=reward), timeout=self.timeout_seconds)
        except grpc.aio.AioRpcError as exc:
            raise _store_error(exc, trajectory_id) from None
        return {
            "object": "feedback",
            "trajectory_id": trajectory_id,
            "reward": _as_dict(reward),
            "replaced": reply.replaced,
            "previous": _as_dict(reply.previous) if reply.replaced else None,
        }

    async def _trajectory(self, trajectory_id: str) -> Trajectory:
        try:
            reply = await self.store.Get(store_pb2.GetRequest(id=trajectory_id), timeout=self.timeout_seconds)
        except grpc.aio.AioRpcError as exc:
            raise _store_error(exc, trajectory_id) from None
        return reply.trajectory

    def _check(self, body: FeedbackRequest) -> None:
        if body.reward is not None and not (math.isfinite(body.reward) and 0.0 <= body.reward <= 1.0):
            raise ApiError(400, "reward must be a number from 0 to 1", "reward")
        if body.reference_answer is not None and not body.reference_answer.strip():
            raise ApiError(400, "reference_answer is empty", "reference_answer")
        if body.reference_answer is not None and len(body.reference_answer) > self.max_answer_chars:
            raise ApiError(400, f"reference_answer longer than {self.max_answer_chars} characters", "reference_answer")

    def _given(self, trajectory: Trajectory, body: FeedbackRequest) -> Reward:
        format_valid = bool(check_trajectory_format(trajectory))  # SFT keeps only answers in their mode's format
        if body.correct is not None:
            value = float(body.correct)
            return Reward(value=value, correct=body.correct, format_valid=format_valid, kind=CORRECTNESS,
                          verifier=feedback_verifier(), components={"r_acc": value})
        value = float(body.reward)
        return Reward(value=value, correct=value >= self.correct_at, format_valid=format_valid, kind=FEEDBACK_KIND,
                      verifier=feedback_verifier(), components={"feedback": value})

    async def _graded(self, trajectory: Trajectory, reference: str) -> Reward:
        request = reward_pb2.ScoreRequest(reference_answer=reference, rollouts=[trajectory])
        try:
            scored = (await self.reward.Score(request, timeout=self.timeout_seconds)).scored[0]
        except grpc.aio.AioRpcError as exc:
            raise from_rpc(exc, "reward", request_id.get()) from None
        reward = Reward()
        reward.CopyFrom(scored.reward)
        reward.verifier = feedback_verifier(scored.reward.verifier)
        return reward


def _served_to(trajectory: Trajectory, caller: str) -> bool:
    # The gateway labels every trajectory it serves with its caller's key; an unlabelled one was put
    # by the platform (evaluation, training rollouts), whose rewards no client may rewrite.
    owner = trajectory.labels.get(LABEL, "")
    return bool(owner) and owner == caller


def _canonical_id(text: str) -> str:
    try:
        return str(uuid.UUID(text))  # the store keeps canonical ids
    except ValueError:
        raise ApiError(400, "trajectory_id must be a UUID (the x-gearshift-trajectory-id of a completion)", "trajectory_id") from None


def _store_error(exc: grpc.aio.AioRpcError, trajectory_id: str) -> ApiError:
    if exc.code() == grpc.StatusCode.NOT_FOUND:
        return ApiError(404, f"no trajectory {trajectory_id}", "trajectory_id")
    return from_rpc(exc, "store", request_id.get())


def _as_dict(reward: Reward) -> dict:
    return MessageToDict(reward, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
