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
policy server loads the new weights after each update (POST /v1/load).

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
from gearshift.evaluation.suites import SUITES
from gearshift.jobs.apo.config import APOConfig, APOPrompt
from gearshift.jobs.apo.rollouts import Group, collect, informative
from gearshift.jobs.on_policy import encode_rollouts, reload_remote, rollout_services
from gearshift.settings import Settings
from gearshift.training import advantages, checkpoints, data, forward, losses, tokenization
from gearshift.training.results import register
from gearshift.training.runtime import Run, StepCallback

log = logging.getLogger("gearshift.jobs.apo")


def gather_prompts(config: APOConfig) -> tuple[list[APOPrompt], list[str]]:
    """Inline prompts plus stored trajectories with a reference answer (each query once)."""
    prompts, ids = list(config.prompts), []
    if config.data is not None:
        if not config.store_addr:
            raise ValueError("data needs store_addr")
        seen = {p.query for p in prompts}
        for trajectory in data.load_trajectories(config.store_addr, config.data):
            if trajectory.reference_answer and trajectory.query not in seen:
                seen.add(trajectory.query)
                graded_by_suite = trajectory.task_source in SUITES and "item_id" in trajectory.labels
                prompts.append(APOPrompt(query=trajectory.query, reference_answer=trajectory.reference_answer,
                                         labels=dict(trajectory.labels), suite=trajectory.task_source if graded_by_suite else ""))
                ids.append(trajectory.id)
    if not prompts:
        raise ValueError("no prompts: give prompts inline or a data filter")
    if config.group_size < 2:
        raise ValueError("a group needs at least two rollouts (3 * rho + gamma >= 2)")
    return prompts, ids


@dataclass
class RolloutBatch:
    """Rollouts encoded for the loss, with their group, reward and advantage."""

    batch: tokenization.Batch
    rewards: torch.Tensor
    groups: torch.Tensor
    advantages: torch.Tensor
    unsampled: int = 0  # learned text the policy did not sample (masked with rollout.exact_tokens)


def encode_groups(tokenizer, groups: list[Group], config: APOConfig) -> RolloutBatch:
    """Tokens and masks of every rollout (on_policy.encode_rollouts), with group and reward."""
    rollouts = [rollout for group in groups for rollout in group.rollouts]
    encoded = encode_rollouts(tokenizer, rollouts, config.rollout, config.max_length)
    rewards = [reward for group in groups for reward in group.rewards]
    group_ids = [index for index, group in enumerate(groups) for _ in group.rollouts]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    reward_tensor, group_tensor = torch.tensor(rewards), torch.tensor(group_ids)
    return RolloutBatch(tokenization.collate(encoded, pad_id), reward_tensor, group_tensor,
                        advantages.group_zscore(reward_tensor, group_tensor), sum(e.unsampled for e in encoded))


def rollout_logprobs(model, batch: tokenization.Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] logprobs of the rollout tokens under model (zeros off target) and the target mask."""
    out = forward.target_logits(model, batch)
    logp = losses.token_logprobs(out.logits, out.tokens)
    mask = torch.zeros_like(batch.target_mask)
    mask[out.rows, out.columns] = True
    return forward.dense(logp, out, batch.input_ids.shape), mask


def apo_update(run: Run, rollouts: RolloutBatch, config: APOConfig, reference=None) -> list[losses.PolicyLoss]:
    """updates_per_batch optimizer steps on one rollout batch; returns each step's loss."""
    logp_old = logp_ref = None
    if config.updates_per_batch > 1:
        with torch.no_grad():
            logp_old, _ = rollout_logprobs(run.model, rollouts.batch)
    if reference is not None and config.kl_coef:
        with torch.no_grad():
            logp_ref, _ = rollout_logprobs(reference, rollouts.batch)
    results = []
    for _ in range(config.updates_per_batch):
        logp, mask = rollout_logprobs(run.model, rollouts.batch)
        old = logp.detach() if logp_old is None else logp_old  # strictly on-policy: ratio 1
        result = losses.policy_loss(
            logp, old, rollouts.advantages, mask, rollouts.groups, config.eps_low, config.eps_high, config.kl_coef, logp_ref
        )
        run.optimize(result.loss)
        results.append(result)
    return results


async def train_async(config: APOConfig, on_step: StepCallback | None = None) -> dict:
    """Runs APO; returns the run's result."""
    prompts, trajectory_ids = gather_prompts(config)
    run = Run.start("apo", config, on_step)
    settings = Settings()
    reference = None
    if config.kl_coef:
        reference = checkpoints.load_frozen(config.reference or config.model.base, settings.models_dir)
    run_id = f"apo-{run.checkpoint_id}"
    rollout_ids: list[str] = []
    async with rollout_services(run, config.rollout, config.store_addr, config.optim.threads) as (stack, remote):
        if remote:
            await reload_remote(run, stack)  # the remote server starts from this run's weights
        for step in run.steps():
            started = time.perf_counter()
            draw = random.Random(config.optim.seed * 1_000_003 + step)
            picked = draw.sample(prompts, k=min(config.prompts_per_step, len(prompts)))
            groups = await collect(stack, stack.executor_addr, stack.reward_addr, picked, config, run_id, step)
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
            rollouts = encode_groups(run.tokenizer, kept, config)
            results = apo_update(run, rollouts, config, reference)
            metrics |= {
                "tokens": rollouts.batch.tokens,
                "target_tokens": int(rollouts.batch.target_mask.sum()),
                "unsampled_tokens": rollouts.unsampled,
                "updated": True,
                "rewards": rollouts.rewards.tolist(),
                "advantages": rollouts.advantages.tolist(),
                "clipped_low": results[-1].clipped_low,
                "clipped_high": results[-1].clipped_high,
                "kl": results[-1].kl,
                "first_update_loss": results[0].loss.item(),
            }
            if remote:
                metrics["reload_seconds"] = await reload_remote(run, stack)
            run.record(step, results[-1].loss.item(), metrics, started)
    result = run.finalize(trajectory_ids + rollout_ids, data.snapshot_id(trajectory_ids + rollout_ids), {"prompts": len(prompts)})
    if run.registers:
        await register(config.store_addr, result)
    return result


def train(config: APOConfig, on_step: StepCallback | None = None) -> dict:
    """Synchronous entry point (the CLI and the container)."""
    return asyncio.run(train_async(config, on_step))
