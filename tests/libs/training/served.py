"""Gateway traffic for the training-from-feedback tests: served trajectories as the executor
stores them (no split, no reference answer), some with a client's verdict, beside every other
kind a store holds (platform-scored, unscored, an evaluation run, a training seed)."""

from __future__ import annotations

import uuid

from gearshift.api.common.v1.common_pb2 import (
    ChatMessage,
    ChatRole,
    Conversation,
    Mode,
    Purpose,
    Reward,
    RoutingStrategy,
    Trajectory,
    TrajectoryStatus,
    Turn,
)
from gearshift.api.store.v1 import store_pb2
from gearshift.rewards.feedback import feedback_verifier
from gearshift.rewards.formats import check_trajectory_format

from tests.libs.training.trajectories import forced_agentic

CONVERSATION = Conversation(instructions="Answer in one word.", messages=[
    ChatMessage(role=ChatRole.CHAT_ROLE_USER, content="Hello"),
    ChatMessage(role=ChatRole.CHAT_ROLE_ASSISTANT, content="Hello! Ask me anything."),
])
LIKED = Reward(value=1.0, correct=True, kind="feedback", verifier=feedback_verifier())
GRADED_RIGHT = Reward(value=1.0, correct=True, kind="feedback", verifier=feedback_verifier("exact"))
DISLIKED = Reward(value=0.0, correct=False, kind="feedback", verifier=feedback_verifier())

SERVED_FROM_US = 1_790_000_000_000_000  # 2026-09-21

# Which rows get a verdict, and which: the rest keep what they were put with.
VERDICTS = {"liked, in a conversation": LIKED, "graded right": GRADED_RIGHT, "disliked": DISLIKED,
            "liked, malformed": LIKED, "liked, an evaluation run": LIKED}
JUDGED_CORRECT = ("liked, in a conversation", "graded right", "liked, malformed")  # served, judged right
WELL_FORMED_CORRECT = ("liked, in a conversation", "graded right")  # of those, in their mode's format


def served(query: str, answer: str, mode: int = Mode.MODE_INSTANT, purpose: int = Purpose.PURPOSE_UNSPECIFIED,
           split: str = "", conversation: Conversation | None = None) -> Trajectory:
    """A trajectory as the executor stores one the gateway served: no split, no reference."""
    return Trajectory(
        id=str(uuid.uuid4()), query=query, mode=mode, routing_strategy=RoutingStrategy.ROUTING_STRATEGY_MODEL,
        routing_rationale="A simple fact.", turns=[Turn(index=0, output=f"{answer}</answer>")], answer=answer,
        status=TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, task_source="gateway", split=split, purpose=purpose,
        conversation=conversation,
    )


def traffic() -> dict[str, Trajectory]:
    """Fresh rows (new ids) by name; the ones in VERDICTS have no reward yet."""
    agentic = forced_agentic(str(uuid.uuid4()))
    agentic.split, agentic.reference_answer, agentic.purpose = "", "", Purpose.PURPOSE_UNSPECIFIED
    agentic.ClearField("reward")
    rows = {
        "liked, in a conversation": served("Capital of France?", "Paris", conversation=CONVERSATION),
        "graded right": agentic,
        "disliked": served("Capital of Spain?", "Barcelona"),
        # Reasoning mode with no <reasoning> block: not its mode's format.
        "liked, malformed": served("Capital of Italy?", "Rome", mode=Mode.MODE_REASONING),
        "scored by the platform": served("Capital of Japan?", "Tokyo"),
        "no verdict": served("Capital of Peru?", "Lima"),
        "liked, an evaluation run": served("Capital of Chile?", "Santiago", purpose=Purpose.PURPOSE_EVALUATION, split="test"),
        "training seed": served("Capital of Egypt?", "Cairo", purpose=Purpose.PURPOSE_TRAINING, split="train"),
    }
    rows["scored by the platform"].reward.CopyFrom(Reward(value=1.0, correct=True, format_valid=True, kind="apo", verifier="phrase"))
    rows["training seed"].reward.CopyFrom(Reward(value=1.0, correct=True, format_valid=True, kind="apo", verifier="suite:facts"))
    for offset, trajectory in enumerate(rows.values()):  # served one after another, in this order
        trajectory.created_at.FromMicroseconds(SERVED_FROM_US + offset)
    return rows


def verdict(trajectory: Trajectory, given: Reward) -> Reward:
    """The reward the gateway stores for a client's verdict: whether the answer was in its mode's
    format is the platform's to say (SFT keeps only those)."""
    reward = Reward()
    reward.CopyFrom(given)
    reward.format_valid = bool(check_trajectory_format(trajectory))
    return reward


async def store_traffic(stub) -> dict[str, Trajectory]:
    """Puts fresh traffic, then gives the verdicts as the gateway does on POST /v1/feedback."""
    rows = traffic()
    await stub.Put(store_pb2.PutRequest(trajectories=list(rows.values())))
    for name, given in VERDICTS.items():
        reply = await stub.SetReward(store_pb2.SetRewardRequest(id=rows[name].id, reward=verdict(rows[name], given)))
        assert not reply.replaced
    return rows


def ids(rows: dict[str, Trajectory], *names: str) -> list[str]:
    return sorted(rows[name].id for name in names)
