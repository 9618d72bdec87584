"""Multi-teacher on-policy distillation (Agents-A1, stage 3; the on-policy distillation loss of
Agarwal et al., "On-Policy Distillation of Language Models", arXiv 2306.13649).

Each step the student runs episodes on a batch of prompts with its current weights, through the
executor, router, planner and sandbox as serving runs them (gearshift.training.on_policy): it calls
tools, and the tool responses it reads are the environment's, never its own. A domain map picks
each prompt's teacher; the loss is the per-token reverse KL(student || teacher) on the tokens the
student wrote, over the full vocabulary or the student's top-k, averaged over those tokens (of the
whole global batch: under torchrun every rank runs its share of the episodes through a running
executor, an inference fleet, or in process rank 0 runs them all; either way every rank then learns
its share of all of them, balanced by tokens). An episode that fails or times out is dropped and
counted (failed_episodes in metrics.jsonl). With rollout.max_async_steps the episodes of step n+1 are generated while step n trains
(on_policy.Rollouts.batches), at most that many updates stale; the reverse KL is taken on the current
student's distribution at the sampled tokens, so it needs no importance ratio: the staleness only
shifts which contexts the student is aligned on. A token whose probability under the trainer and
under the sampler (an older step's weights, or vLLM's kernels: an MoE routes differently) differ
past rollout.off_policy.mask_band is masked; metrics.jsonl has the masked fraction and the
mismatch per step.
Teachers sit whole on every rank's device; under LoRA a teacher that is the student's own base is
the student with its adapter off.
What the platform wrote (a forced mode's prefix, the openers, tool responses) is context, never
a target (gearshift.training.tokenization).

With rollout.executor_addr the episodes run on a running executor whose policy server starts from
the student's weights and gets them after each update, as APO's does (on_policy.RemotePolicy).

Example:
    gearshift train distill --config distill.yaml
    # distill.yaml: {output: {dir: /tmp/student}, teachers: {math: /ckpt/math, qa: /ckpt/qa},
    #                prompts: [{query: "What is 17*23?", domain: math}]}
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass

import torch
from gearshift.api.common.v1.common_pb2 import Mode, Purpose, Trajectory
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.clients import channel
from gearshift.jobs.distill.config import DistillConfig, Prompt
from gearshift.protocol.modes import MODE_OF
from gearshift.settings import Settings
from gearshift.training import batching, data, distributed, forward, losses
from gearshift.training.batching import MicroBatch
from gearshift.training.config import ConversationConfig
from gearshift.training.on_policy import encode_rollouts, gathered, rollout_services, sampling, solve_each
from gearshift.training.results import register
from gearshift.training.runtime import Frozen, Run, StepCallback


def gather_prompts(config: DistillConfig) -> tuple[list[Prompt], list[str]]:
    """The inline prompts plus those of the stored trajectories (and their ids, for lineage)."""
    prompts, ids = list(config.prompts), []
    if config.data is not None:
        if not config.store_addr:
            raise ValueError("data needs store_addr")
        for trajectory in data.load_trajectories(config.store_addr, config.data):
            prompts.append(Prompt(query=trajectory.query, domain=trajectory.labels.get("domain", ""),
                                  conversation=ConversationConfig.of(trajectory.conversation)))
            ids.append(trajectory.id)
    if not prompts:
        raise ValueError("no prompts: give prompts inline or a data filter")
    return prompts, ids


def teacher_of(prompt: Prompt, config: DistillConfig) -> str:
    teacher = config.teachers.get(prompt.domain, config.default_teacher)
    if not teacher:
        raise ValueError(f"no teacher for domain {prompt.domain!r} and no default_teacher")
    return teacher


async def student_rollouts(stack: Settings, prompts: list[Prompt], config: DistillConfig, run_id: str, step: int,
                           first: int = 0) -> list[Trajectory | None]:
    """One episode per prompt with the student's current weights (a pinned mode is injected), in
    the prompt's conversation; prompts are the step's from index first on (a rank's share). An
    episode that failed or timed out is None (on_policy.solve_each)."""
    slots = asyncio.Semaphore(config.rollout.concurrency)
    requests = [
        executor_pb2.SolveRequest(
            query=prompt.query,
            mode=MODE_OF[prompt.mode] if prompt.mode else Mode.MODE_UNSPECIFIED,
            budget=executor_pb2.Budget(max_steps=config.rollout.max_steps),
            task_source="distill",
            split="train",
            run_id=run_id,
            labels={"domain": prompt.domain, "step": str(step)},
            purpose=Purpose.PURPOSE_TRAINING,
            sampling=sampling(config.rollout, config.optim.seed, f"{run_id}/{step}/{index}"),
            trajectory_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{run_id}/{step}/{index}")),
            conversation=prompt.conversation.to_proto() if prompt.conversation else None,
        )
        for index, prompt in enumerate(prompts, start=first)
    ]
    async with channel(stack.executor_addr, stack) as ch:
        stub = executor_pb2_grpc.ExecutorStub(ch)
        return await solve_each(stub, requests, slots, config.rollout.episode_timeout_s)


def teacher_views(run: Run, micro: MicroBatch, owners: list[str], teachers: dict[str, Frozen]) -> tuple[forward.Teacher, ...]:
    """Each teacher's view of the micro-batch's rows it owns (owners[i]: row i's teacher): its last
    hidden states at their targets and its head, whole, from which the student's head recomputes
    its logits chunk by chunk (rows no teacher owns get a KL of 0). Rows ascend in both, so each
    teacher's targets come in the student's order. Every teacher's head is gathered on every
    micro-batch, and a teacher in lockstep (sharded, or the policy's own base) is called on every
    micro-batch, rows or not: every rank makes the same collective calls."""
    target_rows, _ = forward.target_positions(micro.batch)
    _, _, mine = forward.context_split(micro.batch, run.context)  # the student's targets on this rank (None: all)
    views = []
    for source, teacher in teachers.items():
        weight = forward.whole_weight(run.head_of(teacher))
        rows = [row for row, owner in enumerate(owners) if owner == source]
        if rows:
            out = run.score(teacher, micro.select(rows, share_prefix=not teacher.lockstep), hidden_only=True)
            owned = torch.isin(target_rows, torch.tensor(rows)).nonzero().squeeze(-1)  # the teacher's targets among all
            hidden = out.hidden if out.kept is None else run.context.whole(out.hidden, out.kept, len(owned))
            positions = owned
            if mine is not None:  # the student's own targets that this teacher owns, and their rows of hidden
                at = torch.isin(mine, owned)
                positions, hidden = at.nonzero().squeeze(-1), hidden[torch.searchsorted(owned, mine[at])]
            views.append(forward.Teacher(positions.to(hidden.device), hidden, weight))
        elif teacher.lockstep and run.ranks.distributed:
            run.score(teacher, run.filler(), hidden_only=True)
    return tuple(views)


@dataclass
class Mismatch:
    """Counts of the sampler-vs-trainer mismatch over a step's sampled tokens (they add up over
    micro-batches and ranks)."""

    behaviour_tokens: int = 0  # tokens with the sampler's log-probability
    masked: int = 0  # of those, tokens whose ratio left rollout.off_policy.mask_band
    kl_sum: float = 0.0  # k3 estimate of KL(sampler || trainer), summed

    def add(self, logp: torch.Tensor, behaviour: torch.Tensor, band: tuple[float, float]) -> torch.Tensor:
        """Counts these tokens; returns which are masked."""
        _, masked = losses.importance_weights(logp, behaviour, cap=1.0, band=band)
        kept = ~behaviour.isnan()
        self.behaviour_tokens += int(kept.sum())
        self.masked += int(masked.sum())
        self.kl_sum += float(losses.mismatch_kl(behaviour, logp)[kept].sum())
        return masked


def distill_loss_of(run: Run, owners: list[str], behaviour: list[torch.Tensor] | None, teachers: dict[str, Frozen], sampled: int,
                    config: DistillConfig, mismatch: Mismatch):
    """A micro-batch's loss: the reverse KL to each row's teacher summed over its sampled tokens,
    over the step's count of sampled tokens (a token mean over the global batch). A token the
    sampler drew too far from the trainer's distribution (its ratio outside the off-policy band:
    vLLM's kernels, an MoE's routing) is masked out and counted."""

    def loss_of(micro: MicroBatch) -> torch.Tensor:
        views = teacher_views(run, micro, [owners[i] for i in micro.indices], teachers)
        out = run.forward(micro, teachers=views, top_k=config.top_k)
        kl = out.kl
        if behaviour is not None and not micro.filler:
            sampler = out.local(torch.cat([behaviour[i] for i in micro.indices]).to(kl.device))
            kl = torch.where(mismatch.add(out.logprobs, sampler, config.rollout.off_policy.mask_band), 0.0, kl)
        return kl.sum() / sampled

    return loss_of


def learn(run: Run, config: DistillConfig, teachers: dict[str, Frozen], owners: list[str], episodes: list[Trajectory]) -> tuple[float, dict]:
    """One step's update on the student's episodes (owners[i]: the teacher of episode i; every
    rank's, the same list on every rank), each rank learning its share, balanced by tokens;
    returns the step's loss and figures (over every rank)."""
    encoded = encode_rollouts(run.tokenizer, episodes, config.rollout, config.max_length or run.context_length)
    usable = [(owner, e) for owner, e in zip(owners, encoded) if e.target_count]
    sampled = sum(e.target_count for _, e in usable)
    truncated = sum(e.truncated > 0 for e in encoded)
    if not sampled:
        return 0.0, {"tokens": 0, "sampled_tokens": 0, "truncated_rollouts": truncated, "updated": False}
    mine = batching.balanced(run.ranks, usable, lambda pair: len(pair[1].input_ids))
    behaviour = ([torch.tensor(e.target_behaviour(), dtype=torch.float32) for _, e in mine]
                 if config.rollout.raw_sampling else None)
    mismatch = Mismatch()
    loss = run.accumulate(run.micro_batches([e for _, e in mine]),
                          distill_loss_of(run, [o for o, _ in mine], behaviour, teachers, sampled, config, mismatch))
    grad_norm = run.optimize()
    kept, masked, kl_sum = run.ranks.token_sum([mismatch.behaviour_tokens, mismatch.masked, mismatch.kl_sum])
    return loss, {"tokens": sum(len(e.input_ids) for _, e in usable), "sampled_tokens": sampled, "truncated_rollouts": truncated,
                  "grad_norm": grad_norm, "updated": True, "episodes_per_rank": gathered(run, len(mine)),
                  "tokens_per_rank": gathered(run, sum(len(e.input_ids) for _, e in mine)), "behaviour_tokens": int(kept),
                  "masked_fraction": masked / max(kept, 1), "mismatch_kl": kl_sum / max(kept, 1)}


async def train_async(config: DistillConfig, on_step: StepCallback | None = None) -> dict:
    """Runs the distillation; returns the run's result."""
    run = Run.start("distill", config, on_step)
    prompts, trajectory_ids = run.ranks.shared(lambda: gather_prompts(config))
    teachers = {source: run.frozen(source) for source in sorted({teacher_of(p, config) for p in prompts})}
    run_id, rollout_ids = f"distill-{run.checkpoint_id}", []
    max_async = config.rollout.max_async_steps
    async with rollout_services(run, config.rollout, config.store_addr) as rollouts:

        def step_prompts(step: int) -> list[Prompt]:
            draw = random.Random(config.optim.seed * 1_000_003 + step)
            return [prompts[i] for i in draw.sample(range(len(prompts)), k=min(config.batch_size, len(prompts)))]

        async def generate(stack, step: int) -> tuple[list[Prompt], list[Trajectory]]:
            first, share = rollouts.share(step_prompts(step))
            return share, (await student_rollouts(stack, share, config, run_id, step, first) if share else [])

        steps = range(run.start_step + 1, config.optim.max_steps + 1)
        async with rollouts.batches(steps, generate, max_async) as next_batch:
            for step in run.steps():
                started = time.perf_counter()
                batch = await next_batch(step)
                pairs = rollouts.everyones(list(zip(*batch.items)))  # a fleet's: every rank's, so the ranks share the step's tokens
                finished = [(prompt, episode) for prompt, episode in pairs if episode is not None]
                episodes = [episode for _, episode in finished]
                rollout_ids += [t.id for t in episodes]
                owners = [teacher_of(prompt, config) for prompt, _ in finished]
                training_started = time.time()
                if max_async:  # in a thread, so this loop keeps the next step's episodes going meanwhile
                    loss, metrics = await distributed.in_thread(run.ranks.device, learn, run, config, teachers, owners, episodes)
                else:
                    loss, metrics = learn(run, config, teachers, owners, episodes)
                metrics |= {"training_started": training_started, "training_ended": time.time(), "failed_episodes": len(pairs) - len(finished)}
                if metrics["updated"]:
                    metrics["sync_seconds"] = await rollouts.publish(step)  # part of the step's seconds
                else:
                    await rollouts.unchanged(step)
                rollout_seconds = batch.generation_ended - batch.generation_started
                run.record(step, loss, metrics | {"rollout_seconds": rollout_seconds} | batch.timeline(), started)
    domains = sorted({p.domain for p in prompts})
    lineage = trajectory_ids + rollout_ids
    result = run.save_result(lineage, data.snapshot_id(lineage), {"prompts": len(prompts), "domains": len(domains)})
    if run.registers:
        await register(config.store_addr, result)
    return result


def train(config: DistillConfig, on_step: StepCallback | None = None) -> dict:
    """Synchronous entry point (the CLI and the container)."""
    return asyncio.run(train_async(config, on_step))
