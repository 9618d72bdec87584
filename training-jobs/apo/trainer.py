"""APO: Adaptive Policy Optimization (A^2FM, arXiv 2510.12838, section 3.3), i.e. GRPO
(arXiv 2402.03300) with adaptive sampling and SR2AM's clip-higher.

Per step and prompt: rho forced rollouts for each mode (the executor injects the forced prefix)
and gamma free rollouts, all through the executor and sandbox as in serving, with the policy
server serving the current training weights; rewards from the reward service (APO, or SR2AM's
tiered reward); group z-score advantages; logprobs recomputed with the training model on each
rollout's tokens, tool responses, injected text and text the policy did not sample masked; loss = clipped ratio with
eps_low/eps_high, per-trajectory token mean, then group mean (+ optional k3 KL to a reference).

By default the services run in this process and the built-in policy server serves the very
module being trained (rollouts and updates alternate, so it always generates with the newest
weights and no reload is needed). With rollout.executor_addr, a running executor is used and its
policy server gets the new weights after each update (gearshift.jobs.on_policy.RemotePolicy: vLLM
serves each step's LoRA adapter under a new name or reloads full weights in place; the built-in
server loads the checkpoint). metrics.jsonl has each step's sync_seconds within its seconds.

Under torchrun, rank 0 runs the rollouts; each rank learns from its share of the groups (a group
stays on one rank), every token weighted by the step's count of groups over all ranks, so 1 rank
and N make the same update. With a KL term under LoRA, the reference is the policy's base with the
adapter off, not a second copy.

Example:
    gearshift train apo --config apo.yaml
    # apo.yaml: {output: {dir: /tmp/apo}, rho: 1, gamma: 1,
    #            prompts: [{query: "What is 17*23?", reference_answer: "391"}]}
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass

import torch
from gearshift.api.common.v1.common_pb2 import Trajectory
from gearshift.evaluation.suites import SUITES
from gearshift.jobs.apo.config import APOConfig, APOPrompt
from gearshift.jobs.apo.rollouts import Group, collect, informative
from gearshift.jobs.on_policy import encode_rollouts, rollout_services
from gearshift.rewards.feedback import is_feedback
from gearshift.rewards.formats import final_answer
from gearshift.training import advantages, data, losses, tokenization
from gearshift.training.batching import MicroBatch
from gearshift.training.config import ConversationConfig
from gearshift.training.results import register
from gearshift.training.runtime import Frozen, Run, StepCallback

log = logging.getLogger("gearshift.jobs.apo")


def reference_of(trajectory: Trajectory) -> str:
    """What rollouts on a stored trajectory's query are checked against: its reference answer,
    else the served answer a client judged correct (feedback); "" when there is neither."""
    if trajectory.reference_answer:
        return trajectory.reference_answer
    if trajectory.reward.correct and is_feedback(trajectory.reward.verifier):
        return final_answer(trajectory)
    return ""


def _prompt_key(prompt: APOPrompt) -> tuple[str, str]:
    return prompt.query, prompt.conversation.model_dump_json() if prompt.conversation else ""


def gather_prompts(config: APOConfig) -> tuple[list[APOPrompt], list[str]]:
    """Inline prompts plus stored trajectories with a reference (reference_of), each query once
    per conversation, the conversation kept (rollouts see what serving saw)."""
    prompts, ids = list(config.prompts), []
    if config.data is not None:
        if not config.store_addr:
            raise ValueError("data needs store_addr")
        seen = {_prompt_key(p) for p in prompts}
        for trajectory in data.load_trajectories(config.store_addr, config.data):
            reference = reference_of(trajectory)
            graded_by_suite = trajectory.task_source in SUITES and "item_id" in trajectory.labels
            prompt = APOPrompt(query=trajectory.query, reference_answer=reference, labels=dict(trajectory.labels),
                               suite=trajectory.task_source if graded_by_suite else "",
                               conversation=ConversationConfig.of(trajectory.conversation))
            if reference and _prompt_key(prompt) not in seen:
                seen.add(_prompt_key(prompt))
                prompts.append(prompt)
                ids.append(trajectory.id)
    if not prompts:
        raise ValueError("no prompts: give prompts inline or a data filter")
    if config.group_size < 2:
        raise ValueError("a group needs at least two rollouts (3 * rho + gamma >= 2)")
    return prompts, ids


@dataclass
class RolloutBatch:
    """Rollouts encoded for the loss, each with its group, reward, advantage and token weight."""

    encoded: list[tokenization.Encoded]
    rewards: torch.Tensor
    groups: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor  # of each of a rollout's target tokens in the step's loss (losses.trajectory_weights)
    unsampled: int = 0  # learned text the policy did not sample (masked with rollout.exact_tokens)


def group_advantages(groups: list[Group]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every rollout's reward, group index and advantage (the z-score within its group)."""
    rewards = torch.tensor([reward for group in groups for reward in group.rewards])
    group_ids = torch.tensor([index for index, group in enumerate(groups) for _ in group.rollouts], dtype=torch.long)
    return rewards, group_ids, advantages.group_zscore(rewards, group_ids)


def encode_groups(tokenizer, groups: list[Group], config: APOConfig, total_groups: int | None = None) -> RolloutBatch:
    """Tokens and masks of every rollout (on_policy.encode_rollouts), with group, reward, advantage
    and token weight; total_groups is the step's count of groups over every rank (default: these)."""
    rollouts = [rollout for group in groups for rollout in group.rollouts]
    encoded = encode_rollouts(tokenizer, rollouts, config.rollout, config.max_length)
    rewards, group_ids, advantage = group_advantages(groups)
    targets = torch.tensor([example.target_count for example in encoded])
    weights = losses.trajectory_weights(targets, group_ids, total_groups or len(groups))
    return RolloutBatch(encoded, rewards, group_ids, advantage, weights, sum(e.unsampled for e in encoded))


def rollout_logprobs(run: Run, plan: list[MicroBatch], reference: Frozen | None = None) -> list[torch.Tensor | None]:
    """Each rollout's target-token logprobs ([its targets]) under the policy or a reference, without
    gradients, micro-batch by micro-batch in lockstep with the other ranks (fillers included)."""
    found: list[torch.Tensor | None] = [None] * sum(len(micro.indices) for micro in plan)
    with torch.no_grad():
        for micro in plan:
            out = run.forward(micro) if reference is None else run.score(reference, micro)
            logp = losses.token_logprobs(out.logits, out.tokens)
            for index, values in zip(micro.indices, out.per_row(logp, micro.rows)):
                found[index] = values
    return found


def apo_update(run: Run, rollouts: RolloutBatch, config: APOConfig, reference: Frozen | None = None) -> list[dict]:
    """updates_per_batch optimizer steps on this rank's rollouts; returns each step's loss and
    clipping figures, over every rank."""
    plan = run.micro_batches(rollouts.encoded)
    logp_old = rollout_logprobs(run, plan) if config.updates_per_batch > 1 else None
    logp_ref = rollout_logprobs(run, plan, reference) if reference is not None and config.kl_coef else None
    results = []
    for _ in range(config.updates_per_batch):
        parts: list[losses.PolicyLoss] = []

        def loss_of(micro: MicroBatch, out) -> torch.Tensor:
            logp = losses.token_logprobs(out.logits, out.tokens)
            old = logp.detach() if logp_old is None or micro.filler else torch.cat([logp_old[i] for i in micro.indices])
            ref = None if logp_ref is None or micro.filler else torch.cat([logp_ref[i] for i in micro.indices])
            advantage, weight = (micro.gather(values).to(logp.device)[out.rows] for values in (rollouts.advantages, rollouts.weights))
            part = losses.policy_loss(logp, old, advantage, weight, config.eps_low, config.eps_high, config.kl_coef, ref)
            if not micro.filler:
                parts.append(part)
            return part.loss

        loss = run.accumulate(plan, loss_of)
        grad_norm = run.optimize()
        tokens, low, high, ratio, kl = run.ranks.sum([sum(getattr(p, name) for p in parts) for name in CLIP_FIGURES])
        tokens = max(tokens, 1)
        results.append({"loss": loss, "grad_norm": grad_norm, "clipped_low": low / tokens, "clipped_high": high / tokens,
                        "mean_ratio": ratio / tokens, "kl": kl / tokens})
    return results


CLIP_FIGURES = ("tokens", "clipped_low", "clipped_high", "ratio_sum", "kl_sum")


def learn(run: Run, kept: list[Group], config: APOConfig, reference: Frozen | None = None) -> tuple[float, dict]:
    """One step's update on the informative groups, each group on one rank; returns the step's
    loss and figures (over every rank)."""
    mine = encode_groups(run.tokenizer, run.ranks.shard(kept), config, total_groups=len(kept))
    results = apo_update(run, mine, config, reference)
    tokens, targets, unsampled = run.ranks.sum(
        [sum(len(e.input_ids) for e in mine.encoded), sum(e.target_count for e in mine.encoded), mine.unsampled]
    )
    rewards, _, advantage = group_advantages(kept)
    return results[-1]["loss"], {
        "tokens": int(tokens),
        "target_tokens": int(targets),
        "unsampled_tokens": int(unsampled),
        "updated": True,
        "rewards": rewards.tolist(),
        "advantages": advantage.tolist(),
        "grad_norm": results[-1]["grad_norm"],
        "clipped_low": results[-1]["clipped_low"],
        "clipped_high": results[-1]["clipped_high"],
        "kl": results[-1]["kl"],
        "first_update_loss": results[0]["loss"],
    }


async def train_async(config: APOConfig, on_step: StepCallback | None = None) -> dict:
    """Runs APO; returns the run's result."""
    run = Run.start("apo", config, on_step)
    prompts, trajectory_ids = run.ranks.shared(lambda: gather_prompts(config))
    reference = run.frozen(config.reference or config.model.base) if config.kl_coef else None
    run_id = f"apo-{run.checkpoint_id}"
    rollout_ids: list[str] = []
    async with rollout_services(run, config.rollout, config.store_addr) as rollouts:
        for step in run.steps():
            started = time.perf_counter()
            draw = random.Random(config.optim.seed * 1_000_003 + step)
            picked = draw.sample(prompts, k=min(config.prompts_per_step, len(prompts)))
            groups = await rollouts.collect(lambda stack: collect(stack, stack.executor_addr, stack.reward_addr, picked, config, run_id, step))
            rollout_seconds = time.perf_counter() - started
            rollout_ids += [t.id for group in groups for t in group.rollouts]
            kept = informative(groups, config.pass_rate_window)
            metrics = {
                "reward_mean": sum(r for g in groups for r in g.rewards) / sum(len(g.rewards) for g in groups),
                "rollouts": sum(len(g.rollouts) for g in groups),
                "groups_dropped": len(groups) - len(kept),
                "rollout_seconds": rollout_seconds,
            }
            if not kept:  # nothing to learn this step: every group's rewards were equal
                log.info("step %d: all %d groups dropped (equal rewards or outside the pass-rate window)", step, len(groups))
                run.record(step, 0.0, metrics | {"tokens": 0, "updated": False}, started)
                continue
            loss, learned = learn(run, kept, config, reference)
            learned["sync_seconds"] = await rollouts.publish(step)  # part of the step's seconds
            run.record(step, loss, metrics | learned, started)
    result = run.finalize(trajectory_ids + rollout_ids, data.snapshot_id(trajectory_ids + rollout_ids), {"prompts": len(prompts)})
    if run.registers:
        await register(config.store_addr, result)
    return result


def train(config: APOConfig, on_step: StepCallback | None = None) -> dict:
    """Synchronous entry point (the CLI and the container)."""
    return asyncio.run(train_async(config, on_step))
