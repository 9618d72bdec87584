"""The score step: a suite's verdict is kept, the reward formulas still run on it; trajectories
without a verdict are verified by the reward service."""

from __future__ import annotations

from gearshift.api.common.v1.common_pb2 import Mode, Reward, RoutingStrategy, TrajectoryStatus
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.orchestration import task_bodies

from tests.libs.rewards.trajectories import rollout


def graded(ident: str, mode: int, answer: str, correct: bool | None):
    trajectory = rollout(mode, answer, forced=True, ident=ident)
    trajectory.reference_answer, trajectory.status = "Paris", TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED
    if correct is not None:
        trajectory.reward.CopyFrom(Reward(correct=correct, kind="correctness", verifier="suite:facts"))
    return trajectory


async def test_suite_verdicts_are_kept_and_others_verified(settings):
    suite_graded = [
        # the suite's phrase match says correct; exact match against "Paris" would not
        graded("00000000-0000-4000-8000-000000000001", Mode.MODE_INSTANT, "The capital is Paris.", True),
        graded("00000000-0000-4000-8000-000000000002", Mode.MODE_REASONING, "Lyon", False),
    ]
    ungraded = [graded("00000000-0000-4000-8000-000000000003", Mode.MODE_INSTANT, "The capital is Paris.", None)]
    ungraded[0].query = "Another question"
    async with embedded(settings, ("store", "reward")) as platform:
        stack = platform.settings
        async with channel(stack.store_addr, stack) as ch:
            store = store_pb2_grpc.TrajectoryStoreStub(ch)
            await store.Put(store_pb2.PutRequest(trajectories=suite_graded + ungraded))
            assert await task_bodies.score(stack, suite_graded + ungraded) == 3
            rewards = [(await store.Get(store_pb2.GetRequest(id=t.id))).trajectory.reward for t in suite_graded + ungraded]
    kept, wrong, verified = rewards
    assert (kept.correct, kept.kind, kept.verifier, kept.value) == (True, "apo", "suite:facts", 1.0)
    assert kept.components["r_adaptive"] == 1.0 and kept.components["r_format"] == 1.0
    assert (wrong.correct, wrong.value) == (False, 0.0)
    assert verified.kind == "apo" and verified.verifier != "suite:facts"
    assert verified.correct  # the reward service's own verifier: a phrase match of "Paris"
    assert ungraded[0].routing_strategy == RoutingStrategy.ROUTING_STRATEGY_FORCED
