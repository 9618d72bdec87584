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
policy server gets the new weights after each update (gearshift.training.on_policy.RemotePolicy: vLLM
serves each step's LoRA adapter under a new name or reloads full weights in place; the built-in
server loads the checkpoint). metrics.jsonl has each step's sync_seconds within its seconds.

Under torchrun, every rank rolls out its share of the step's prompts through a running executor (an
inference fleet; in process rank 0 runs them all); every rank then has every group and learns its
share of their rollouts, balanced by tokens, every token weighted by the step's count of groups,
so 1 rank and N make the same update. A rollout that fails or times out is dropped and counted
(failed_episodes in metrics.jsonl). With rollout.max_async_steps the rollouts of step n+1 are generated while step n trains
(on_policy.Rollouts.batches). The loss is decoupled from the policy that sampled (AReaL's decoupled
PPO): the clipped ratio is against the weights before the update, and each token weighs the ratio
of those to the sampler's log-probability (kept with the sampled tokens: an older step's weights,
or vLLM's kernels for the same ones), truncated, masked outside a band, and dual-clipped
(losses.policy_loss; rollout.off_policy). metrics.jsonl has each step's staleness, masked
fraction and trainer-vs-sampler mismatch. With a KL term under LoRA, the reference is the policy's base with the
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
from gearshift.errors import FailedPrecondition
from gearshift.rewards.feedback import is_feedback
from gearshift.rewards.formats import final_answer
from gearshift.training import advantages, data, distributed, losses, tokenization
from gearshift.training.batching import MicroBatch, balance
from gearshift.training.config import ConversationConfig
from gearshift.training.on_policy import encode_rollouts, gathered, rollout_services
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
    # Each rollout's target tokens' log-probabilities under the policy that sampled them (NaN where
    # not kept); None: not used (the rollouts sampled another distribution than the model's own).
    behaviour: list[torch.Tensor] | None = None

    def share(self, ranks) -> RolloutBatch:
        """This rank's rollouts, the batch's split over the ranks by tokens (a group's rollouts may
        land on several: advantages and weights are the whole step's, so the update is the same)."""
        mine = balance([len(e.input_ids) for e in self.encoded], ranks.data_ranks)[ranks.data_rank]
        index = torch.tensor(mine, dtype=torch.long)
        return RolloutBatch([self.encoded[i] for i in mine], self.rewards[index], self.groups[index], self.advantages[index],
                            self.weights[index], sum(self.encoded[i].unsampled for i in mine),
                            None if self.behaviour is None else [self.behaviour[i] for i in mine])


def group_advantages(groups: list[Group]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every rollout's reward, group index and advantage (the z-score within its group)."""
    rewards = torch.tensor([reward for group in groups for reward in group.rewards])
    group_ids = torch.tensor([index for index, group in enumerate(groups) for _ in group.rewards], dtype=torch.long)
    return rewards, group_ids, advantages.group_zscore(rewards, group_ids)


def encode_groups(tokenizer, groups: list[Group], config: APOConfig, behaviour: bool = False, max_length: int | None = None) -> RolloutBatch:
    """Tokens and masks of every rollout of the step's groups (on_policy.encode_rollouts, at most
    max_length tokens each: default the config's), with group, reward, advantage and token weight;
    behaviour: keep the log-probabilities the rollouts were sampled with (the importance weights')."""
    rollouts = [rollout for group in groups for rollout in group.rollouts]
    encoded = encode_rollouts(tokenizer, rollouts, config.rollout, max_length or config.max_length)
    rewards, group_ids, advantage = group_advantages(groups)
    targets = torch.tensor([example.target_count for example in encoded])
    weights = losses.trajectory_weights(targets, group_ids, len(groups))
    kept = [torch.tensor(e.target_behaviour(), dtype=torch.float32) for e in encoded] if behaviour else None
    return RolloutBatch(encoded, rewards, group_ids, advantage, weights, sum(e.unsampled for e in encoded), kept)


def rollout_logprobs(run: Run, plan: list[MicroBatch], reference: Frozen | None = None) -> list[torch.Tensor | None]:
    """Each rollout's target-token logprobs ([its targets]) under the policy or a reference, without
    gradients, micro-batch by micro-batch in lockstep with the other ranks (fillers included)."""
    found: list[torch.Tensor | None] = [None] * sum(len(micro.indices) for micro in plan)
    with torch.no_grad():
        for micro in plan:
            out = run.forward(micro) if reference is None else run.score(reference, micro)
            for index, values in zip(micro.indices, out.per_row(out.logprobs, micro.rows)):
                found[index] = values
    return found


def apo_update(run: Run, rollouts: RolloutBatch, config: APOConfig, reference: Frozen | None = None) -> list[dict]:
    """updates_per_batch optimizer steps on this rank's rollouts; returns each step's loss and
    clipping figures, over every rank. The ratio's old policy is the proximal one (the weights
    before these updates: recomputed when there are several updates, else the forward's own,
    detached); the sampler's log-probabilities, where kept, weight each token (losses.policy_loss)."""
    plan = run.micro_batches(rollouts.encoded)
    logp_old = rollout_logprobs(run, plan) if config.updates_per_batch > 1 else None
    logp_ref = rollout_logprobs(run, plan, reference) if reference is not None and config.kl_coef else None
    off_policy = config.rollout.off_policy
    results = []
    for _ in range(config.updates_per_batch):
        parts: list[losses.PolicyLoss] = []
        entropy_sums: list[float] = []

        def per_token(values: list[torch.Tensor | None] | None, micro: MicroBatch, device) -> torch.Tensor | None:
            return None if values is None or micro.filler else torch.cat([values[i] for i in micro.indices]).to(device)

        def loss_of(micro: MicroBatch) -> torch.Tensor:
            out = run.forward(micro, entropy=True)
            logp = out.logprobs
            old = per_token(logp_old, micro, logp.device)  # this rank's targets: rollout_logprobs kept its own
            behaviour = per_token(rollouts.behaviour, micro, logp.device)  # every target's
            advantage, weight = (micro.gather(values).to(logp.device)[out.rows] for values in (rollouts.advantages, rollouts.weights))
            part = losses.policy_loss(logp, logp.detach() if old is None else old, advantage, weight, config.eps_low, config.eps_high,
                                      config.kl_coef, per_token(logp_ref, micro, logp.device),
                                      None if behaviour is None else out.local(behaviour), config.dual_clip,
                                      off_policy.importance_cap, off_policy.mask_band)
            if not micro.filler:
                parts.append(part)
                entropy_sums.append(float(out.entropy.sum()))
            return part.loss

        loss = run.accumulate(plan, loss_of)
        grad_norm = run.optimize()
        totals = dict(zip((*LOSS_FIGURES, "entropy"), run.ranks.token_sum([*(sum(getattr(p, name) for p in parts) for name in LOSS_FIGURES),
                                                                     sum(entropy_sums)])))
        tokens, sampled = max(totals["tokens"], 1), max(totals["behaviour_tokens"], 1)
        results.append({"loss": loss, "grad_norm": grad_norm, "clipped_low": totals["clipped_low"] / tokens,
                        "clipped_high": totals["clipped_high"] / tokens, "dual_clipped": totals["dual_clipped"] / tokens,
                        "mean_ratio": totals["ratio_sum"] / tokens, "kl": totals["kl_sum"] / tokens, "entropy": totals["entropy"] / tokens,
                        "behaviour_tokens": int(totals["behaviour_tokens"]), "masked_fraction": totals["masked"] / sampled,
                        "truncated_fraction": totals["truncated"] / sampled, "mismatch_kl": totals["mismatch_kl_sum"] / sampled})
    return results


LOSS_FIGURES = ("tokens", "clipped_low", "clipped_high", "dual_clipped", "ratio_sum", "kl_sum", "behaviour_tokens", "masked",
                "truncated", "mismatch_kl_sum")


def learn(run: Run, kept: list[Group], config: APOConfig, reference: Frozen | None = None, stale: bool = False) -> tuple[float, dict]:
    """One step's update on the informative groups (every rank's, the same list on every rank),
    each rank learning its share of their rollouts, balanced by tokens; returns the step's loss
    and figures (over every rank). The sampler's log-probabilities are used wherever kept and the
    rollouts sampled the raw distribution; stale (asynchronous rollouts) needs them."""
    every = encode_groups(run.tokenizer, kept, config, behaviour=config.rollout.raw_sampling, max_length=config.max_length or run.context_length)
    if stale and not any(bool((~b.isnan()).any()) for b in every.behaviour or []):
        raise FailedPrecondition(
            "no rollout kept its sampled tokens' log-probabilities, which weigh asynchronous rollouts' tokens: "
            "keep GEARSHIFT_POLICY_CLIENT__RETURN_LOGPROBS on at the executor (and the router and planner)"
        )
    mine = every.share(run.ranks)
    results = apo_update(run, mine, config, reference)
    last = results[-1]
    return last["loss"], {
        "rollouts_per_rank": gathered(run, len(mine.encoded)),
        "tokens_per_rank": gathered(run, sum(len(e.input_ids) for e in mine.encoded)),
        "tokens": sum(len(e.input_ids) for e in every.encoded),
        "target_tokens": sum(e.target_count for e in every.encoded),
        "unsampled_tokens": every.unsampled,
        "truncated_rollouts": sum(e.truncated > 0 for e in every.encoded),
        "updated": True,
        "rewards": every.rewards.tolist(),
        "advantages": every.advantages.tolist(),
        **{name: last[name] for name in STEP_FIGURES},
        "first_update_loss": results[0]["loss"],
    }


STEP_FIGURES = ("grad_norm", "clipped_low", "clipped_high", "dual_clipped", "kl", "entropy", "behaviour_tokens", "masked_fraction",
                "truncated_fraction", "mismatch_kl")


def step_prompts(prompts: list[APOPrompt], config: APOConfig, step: int) -> list[APOPrompt]:
    """The step's prompts (the same on every rank and in every rerun of the run)."""
    draw = random.Random(config.optim.seed * 1_000_003 + step)
    return draw.sample(prompts, k=min(config.prompts_per_step, len(prompts)))


async def train_async(config: APOConfig, on_step: StepCallback | None = None) -> dict:
    """Runs APO; returns the run's result."""
    run = Run.start("apo", config, on_step)
    prompts, trajectory_ids = run.ranks.shared(lambda: gather_prompts(config))
    reference = run.frozen(config.reference or config.model.base) if config.kl_coef else None
    run_id = f"apo-{run.checkpoint_id}"
    rollout_ids: list[str] = []
    max_async = config.rollout.max_async_steps
    async with rollout_services(run, config.rollout, config.store_addr) as rollouts:

        async def generate(stack, step: int) -> list[Group]:
            first, share = rollouts.share(step_prompts(prompts, config, step))
            return await collect(stack, stack.executor_addr, stack.reward_addr, share, config, run_id, step, first) if share else []

        steps = range(run.start_step + 1, config.optim.max_steps + 1)
        async with rollouts.batches(steps, generate, max_async) as next_batch:
            for step in run.steps():
                started = time.perf_counter()
                batch = await next_batch(step)
                groups = rollouts.everyones(batch.items)  # a fleet's: every rank's, so the ranks share the step's tokens
                ids = [t.id for group in groups for t in group.rollouts]
                rollout_ids += ids
                kept = informative(groups, config.pass_rate_window)
                metrics = {
                    "reward_mean": sum(r for g in groups for r in g.rewards) / max(len(ids), 1),
                    "rollouts": len(ids),
                    "failed_episodes": sum(g.failed for g in groups),
                    "groups_dropped": len(groups) - len(kept),
                    "rollout_seconds": batch.generation_ended - batch.generation_started,
                    **batch.timeline(),
                }
                if not kept:  # nothing to learn this step: every group's rewards were equal
                    log.info("step %d: all %d groups dropped (equal rewards or outside the pass-rate window)", step, len(groups))
                    await rollouts.unchanged(step)
                    run.record(step, 0.0, metrics | {"tokens": 0, "updated": False}, started)
                    continue
                training_started = time.time()
                if max_async:  # in a thread, so this loop keeps the next step's rollouts going meanwhile
                    loss, learned = await distributed.in_thread(run.ranks.device, learn, run, kept, config, reference, True)
                else:
                    loss, learned = learn(run, kept, config, reference)
                learned |= {"training_started": training_started, "training_ended": time.time()}
                learned["sync_seconds"] = await rollouts.publish(step)  # part of the step's seconds
                run.record(step, loss, metrics | learned, started)
    result = run.save_result(trajectory_ids + rollout_ids, data.snapshot_id(trajectory_ids + rollout_ids), {"prompts": len(prompts)})
    if run.registers:
        await register(config.store_addr, result)
    return result


def train(config: APOConfig, on_step: StepCallback | None = None) -> dict:
    """Synchronous entry point (the CLI and the container)."""
    return asyncio.run(train_async(config, on_step))
