"""A seeded episode repeats: the tiny random policy on the built-in server at temperature 1,
through the real executor, router and planner, routed by the model (every model call samples).
The same seed gives the same episode, alone or batched with others; another seed does not."""

from __future__ import annotations

import asyncio

from gearshift.api.common.v1.common_pb2 import Sampling, Trajectory
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.settings import ExecutorSettings, Settings
from gearshift.training.tiny import tiny_checkpoint


def what_was_sampled(trajectory: Trajectory) -> tuple:
    return trajectory.mode, trajectory.routing_rationale, tuple((t.plan_decision, t.output) for t in trajectory.turns)


async def test_the_same_seed_samples_the_same_episode_and_another_seed_another(tmp_path):
    settings = Settings(data_dir=tmp_path, metrics_port=0, executor=ExecutorSettings(max_tokens_per_turn=16, max_steps_agentic=2, max_steps_other=2))
    async with embedded(settings, policy_model=str(tiny_checkpoint(tmp_path / "tiny"))) as platform, channel(platform.settings.executor_addr, platform.settings) as ch:
        stub = executor_pb2_grpc.ExecutorStub(ch)

        async def solve(seed: int) -> tuple:
            request = executor_pb2.SolveRequest(query="What is 12 + 17?", sampling=Sampling(temperature=1.0, top_p=1.0, seed=seed))
            return what_was_sampled([event async for event in stub.Solve(request)][-1].final.trajectory)

        alone = await solve(7)
        batched = await asyncio.gather(*(solve(seed) for seed in (7, 8, 7, 9)))
    assert batched[0] == batched[2] == alone  # the same episode, whatever else the server batched with it
    assert len({alone, batched[1], batched[3]}) == 3  # other seeds, other episodes
