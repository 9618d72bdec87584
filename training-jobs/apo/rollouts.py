"""APO's rollouts through the executor, the code path serving uses (router, planner, sandbox,
reward, store), and their rewards from the reward service."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from gearshift.api.common.v1.common_pb2 import Mode, Purpose, Trajectory
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.api.reward.v1 import reward_pb2, reward_pb2_grpc
from gearshift.clients import channel
from gearshift.jobs.apo.config import APOConfig, APOPrompt
from gearshift.protocol.modes import MODE_OF
from gearshift.settings import Settings

REWARD_KINDS = {"apo": reward_pb2.REWARD_KIND_APO, "sr2am": reward_pb2.REWARD_KIND_SR2AM}


@dataclass
class Group:
    """One prompt's rollouts and their rewards, in the same order."""

    prompt: APOPrompt
    rollouts: list[Trajectory]
    rewards: list[float]
    forced_instant_success_rate: float


def group_requests(prompt: APOPrompt, config: APOConfig, run_id: str, step: int, index: int) -> list[executor_pb2.SolveRequest]:
    """rho forced requests per mode (the executor injects the forced prefix), then gamma free
    ones. Ids are derived from run, step and slot, so a resumed step finds its stored rollouts."""
    slots = [(mode, k) for mode in MODE_OF.values() for k in range(config.rho)]
    slots += [(Mode.MODE_UNSPECIFIED, k) for k in range(config.gamma)]
    budget = executor_pb2.Budget(max_steps=config.rollout.max_steps)
    return [
        executor_pb2.SolveRequest(
            query=prompt.query,
            mode=mode,
            reference_answer=prompt.reference_answer,
            budget=budget,
            task_source=config.task_source,
            split="train",
            run_id=run_id,
            labels={**prompt.labels, "step": str(step), "sample": str(k)},
            purpose=Purpose.PURPOSE_TRAINING,
            trajectory_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{run_id}/{step}/{index}/{Mode.Name(mode)}/{k}")),
        )
        for mode, k in slots
    ]


async def solve(stub: executor_pb2_grpc.ExecutorStub, request: executor_pb2.SolveRequest, slots: asyncio.Semaphore) -> Trajectory:
    """Runs one episode; returns the stored trajectory from the final event."""
    async with slots:
        async for item in stub.Solve(request):
            if item.HasField("final"):
                return item.final.trajectory
    raise RuntimeError(f"the executor ended episode {request.trajectory_id} without a final event")


async def collect(
    settings: Settings, executor_addr: str, reward_addr: str, prompts: list[APOPrompt], config: APOConfig, run_id: str, step: int
) -> list[Group]:
    """Rolls out every prompt's group through the executor and scores each group."""
    slots = asyncio.Semaphore(config.rollout.concurrency)
    async with channel(executor_addr, settings) as executor_ch, channel(reward_addr, settings) as reward_ch:
        executor = executor_pb2_grpc.ExecutorStub(executor_ch)
        reward = reward_pb2_grpc.RewardStub(reward_ch)
        requests = [group_requests(p, config, run_id, step, i) for i, p in enumerate(prompts)]
        rollouts = await asyncio.gather(*(asyncio.gather(*(solve(executor, r, slots) for r in group)) for group in requests))
        groups = []
        for prompt, trajectories in zip(prompts, rollouts):
            scored = await reward.Score(
                reward_pb2.ScoreRequest(reference_answer=prompt.reference_answer, kind=REWARD_KINDS[config.reward], rollouts=trajectories)
            )
            rewards = [item.reward.value for item in scored.scored]
            groups.append(Group(prompt, list(trajectories), rewards, scored.forced_instant_success_rate))
    return groups
