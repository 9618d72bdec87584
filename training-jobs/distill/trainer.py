"""Multi-teacher on-policy distillation (Agents-A1, stage 3; the on-policy distillation loss of
Agarwal et al., "On-Policy Distillation of Language Models", arXiv 2306.13649).

Each step the student runs episodes on a batch of prompts with its current weights, through the
executor, router, planner and sandbox as serving runs them (gearshift.jobs.on_policy): it calls
tools, and the tool responses it reads are the environment's, never its own. A domain map picks
each prompt's teacher; the loss is the per-token reverse KL(student || teacher) on the tokens the
student wrote, over the full vocabulary or the student's top-k, averaged over those tokens (of the
whole global batch: under torchrun rank 0 runs the episodes and each rank learns its share).
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

import torch
from gearshift.api.common.v1.common_pb2 import Mode, Purpose, Trajectory
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.clients import channel
from gearshift.jobs.distill.config import DistillConfig, Prompt
from gearshift.jobs.on_policy import encode_rollouts, rollout_services, sampling, solve
from gearshift.protocol.modes import MODE_OF
from gearshift.settings import Settings
from gearshift.training import batching, data, forward, losses
from gearshift.training.batching import MicroBatch
from gearshift.training.config import ConversationConfig
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


async def student_rollouts(stack: Settings, prompts: list[Prompt], config: DistillConfig, run_id: str, step: int) -> list[Trajectory]:
    """One episode per prompt with the student's current weights (a pinned mode is injected), in
    the prompt's conversation."""
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
        for index, prompt in enumerate(prompts)
    ]
    async with channel(stack.executor_addr, stack) as ch:
        stub = executor_pb2_grpc.ExecutorStub(ch)
        return list(await asyncio.gather(*(solve(stub, request, slots) for request in requests)))


def teacher_logits(run: Run, student: forward.TargetLogits, micro: MicroBatch, owners: list[str], teachers: dict[str, Frozen]) -> torch.Tensor:
    """The teachers' logits at the student's target positions: row i scored by owners[i]'s teacher
    (rows no teacher owns keep the student's own logits, a KL of 0). Rows ascend in both, so each
    teacher's sub-batch targets come in the student's order. A teacher in lockstep (the policy's
    own base) is called on every micro-batch, rows or not."""
    logits = student.logits.detach().clone()
    for source, teacher in teachers.items():
        rows = [row for row, owner in enumerate(owners) if owner == source]
        if rows:
            scored = run.score(teacher, micro.select(rows, share_prefix=not teacher.lockstep)).logits
            logits[torch.isin(student.rows, torch.tensor(rows, device=student.rows.device))] = scored.to(logits.dtype)
        elif teacher.lockstep and run.ranks.distributed:
            run.score(teacher, batching.filler(run.pad_id, share_prefix=False))
    return logits


def distill_loss_of(run: Run, owners: list[str], teachers: dict[str, Frozen], sampled: int, top_k: int | None):
    """A micro-batch's loss: the reverse KL to each row's teacher summed over its sampled tokens,
    over the step's count of sampled tokens (a token mean over the global batch)."""

    def loss_of(micro: MicroBatch, out: forward.TargetLogits) -> torch.Tensor:
        rows = [owners[i] for i in micro.indices]
        return losses.reverse_kl(out.logits, teacher_logits(run, out, micro, rows, teachers), top_k).sum() / sampled

    return loss_of


def learn(run: Run, config: DistillConfig, teachers: dict[str, Frozen], owners: list[str], episodes: list[Trajectory]) -> tuple[float, dict]:
    """One step's update on the student's episodes (owners[i]: the teacher of episode i), each rank
    learning its share; returns the step's loss and figures (over every rank)."""
    encoded = encode_rollouts(run.tokenizer, episodes, config.rollout, config.max_length)
    usable = [(owner, e) for owner, e in zip(owners, encoded) if e.target_count]
    if not usable:
        return 0.0, {"tokens": 0, "sampled_tokens": 0, "updated": False}
    sampled = sum(e.target_count for _, e in usable)
    mine = run.ranks.shard(usable)
    loss = run.accumulate(run.micro_batches([e for _, e in mine]), distill_loss_of(run, [o for o, _ in mine], teachers, sampled, config.top_k))
    grad_norm = run.optimize()
    return loss, {"tokens": sum(len(e.input_ids) for _, e in usable), "sampled_tokens": sampled, "grad_norm": grad_norm, "updated": True}


async def train_async(config: DistillConfig, on_step: StepCallback | None = None) -> dict:
    """Runs the distillation; returns the run's result."""
    run = Run.start("distill", config, on_step)
    prompts, trajectory_ids = run.ranks.shared(lambda: gather_prompts(config))
    teachers = {source: run.frozen(source) for source in sorted({teacher_of(p, config) for p in prompts})}
    run_id, rollout_ids = f"distill-{run.checkpoint_id}", []
    async with rollout_services(run, config.rollout, config.store_addr) as rollouts:
        for step in run.steps():
            started = time.perf_counter()
            draw = random.Random(config.optim.seed * 1_000_003 + step)
            picked = [prompts[i] for i in draw.sample(range(len(prompts)), k=min(config.batch_size, len(prompts)))]
            episodes = await rollouts.collect(lambda stack: student_rollouts(stack, picked, config, run_id, step))
            rollout_seconds = time.perf_counter() - started
            rollout_ids += [t.id for t in episodes]
            loss, metrics = learn(run, config, teachers, [teacher_of(p, config) for p in picked], episodes)
            if metrics["updated"]:
                metrics["sync_seconds"] = await rollouts.publish(step)  # part of the step's seconds
            run.record(step, loss, metrics | {"rollout_seconds": rollout_seconds}, started)
    domains = sorted({p.domain for p in prompts})
    lineage = trajectory_ids + rollout_ids
    result = run.finalize(lineage, data.snapshot_id(lineage), {"prompts": len(prompts), "domains": len(domains)})
    if run.registers:
        await register(config.store_addr, result)
    return result


def train(config: DistillConfig, on_step: StepCallback | None = None) -> dict:
    """Synchronous entry point (the CLI and the container)."""
    return asyncio.run(train_async(config, on_step))
