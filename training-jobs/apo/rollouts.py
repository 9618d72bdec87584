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
from gearshift.evaluation.runner import verifier_name
from gearshift.evaluation.suites import find_item
from gearshift.jobs.apo.config import APOConfig, APOPrompt
from gearshift.protocol.modes import MODE_OF
from gearshift.rewards.scoring import score_group
from gearshift.settings import Settings
from gearshift.training.on_policy import sampling, solve_each

REWARD_KINDS = {"apo": reward_pb2.REWARD_KIND_APO, "sr2am": reward_pb2.REWARD_KIND_SR2AM}


@dataclass
class Group:
    """One prompt's rollouts, their rewards and verdicts, in the same order."""

    prompt: APOPrompt
    rollouts: list[Trajectory]
    rewards: list[float]
    forced_instant_success_rate: float
    correct: list[bool]
    failed: int = 0  # rollouts that failed or timed out, dropped (on_policy.solve_each)

    @property
    def pass_rate(self) -> float:
        return sum(self.correct) / max(len(self.correct), 1)


def informative(groups: list[Group], window: tuple[float, float] | None) -> list[Group]:
    """The groups worth an update: not all rewards equal (their advantages would all be 0; a group
    left with one rollout or none after failures is such a group), and with a pass rate inside
    the window when one is set (SR2AM keeps [1/8, 6/8])."""
    kept = [g for g in groups if len(set(g.rewards)) > 1]
    if window is not None:
        kept = [g for g in kept if window[0] <= g.pass_rate <= window[1]]
    return kept


def group_requests(prompt: APOPrompt, config: APOConfig, run_id: str, step: int, index: int) -> list[executor_pb2.SolveRequest]:
    """rho forced requests per mode (the executor injects the forced prefix), then gamma free
    ones, each in the prompt's conversation. Ids are derived from run, step and slot, so a resumed
    step finds its stored rollouts."""
    slots = [(mode, k) for mode in MODE_OF.values() for k in range(config.rho)]
    slots += [(Mode.MODE_UNSPECIFIED, k) for k in range(config.gamma)]
    budget = executor_pb2.Budget(max_steps=config.rollout.max_steps)
    ids = [str(uuid.uuid5(uuid.NAMESPACE_URL, f"{run_id}/{step}/{index}/{Mode.Name(mode)}/{k}")) for mode, k in slots]
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
            sampling=sampling(config.rollout, config.optim.seed, trajectory_id),
            trajectory_id=trajectory_id,
            conversation=prompt.conversation.to_proto() if prompt.conversation else None,
        )
        for (mode, k), trajectory_id in zip(slots, ids, strict=True)
    ]


async def collect(
    settings: Settings, executor_addr: str, reward_addr: str, prompts: list[APOPrompt], config: APOConfig, run_id: str, step: int,
    first: int = 0,
) -> list[Group]:
    """Rolls out every prompt's group through the executor and scores each group; prompts are the
    step's from index first on (a rank's share: the rollout ids stay those of one process). A
    rollout that fails is dropped from its group and counted (Group.failed)."""
    slots = asyncio.Semaphore(config.rollout.concurrency)
    async with channel(executor_addr, settings) as executor_ch, channel(reward_addr, settings) as reward_ch:
        executor = executor_pb2_grpc.ExecutorStub(executor_ch)
        reward = reward_pb2_grpc.RewardStub(reward_ch)
        requests = [group_requests(p, config, run_id, step, i) for i, p in enumerate(prompts, start=first)]
        timeout = config.rollout.episode_timeout_s
        rollouts = await asyncio.gather(*(solve_each(executor, group, slots, timeout) for group in requests))
        groups = []
        for prompt, finished in zip(prompts, rollouts):
            trajectories = [t for t in finished if t is not None]
            failed = len(finished) - len(trajectories)
            if not trajectories:
                groups.append(Group(prompt, [], [], -1.0, [], failed))
                continue
            if prompt.suite:  # graded as evaluation grades it: the suite's own grader
                item = find_item(prompt.suite, prompt.labels["item_id"])
                verdicts = [bool(t.answer.strip()) and item.grade(t.answer) for t in trajectories]
                scored = score_group(trajectories, verdicts, config.reward, verifier_name(prompt.suite), settings.reward)
                rewards = [r.value for r in scored.rewards]
                p = scored.forced_instant_success_rate
                groups.append(Group(prompt, trajectories, rewards, -1.0 if p is None else p, verdicts, failed))
                continue
            reply = await reward.Score(
                reward_pb2.ScoreRequest(reference_answer=prompt.reference_answer, kind=REWARD_KINDS[config.reward], rollouts=trajectories)
            )
            groups.append(Group(prompt, trajectories, [s.reward.value for s in reply.scored],
                                reply.forced_instant_success_rate, [s.reward.correct for s in reply.scored], failed))
    return groups
