"""Multi-teacher on-policy distillation (Agents-A1, stage 3; the on-policy distillation loss of
Agarwal et al., "On-Policy Distillation of Language Models", arXiv 2306.13649).

Each step the student runs episodes on a batch of prompts with its current weights, through the
executor, router, planner and sandbox as serving runs them (gearshift.jobs.on_policy): it calls
tools, and the tool responses it reads are the environment's, never its own. A domain map picks
each prompt's teacher; the loss is the per-token reverse KL(student || teacher) on the tokens the
student wrote, over the full vocabulary or the student's top-k, averaged over those tokens.
What the platform wrote (a forced mode's prefix, the openers, tool responses) is context, never
a target (gearshift.training.tokenization).

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
from gearshift.jobs.on_policy import encode_rollouts, reload_remote, rollout_services, sampling, solve
from gearshift.protocol.modes import MODE_OF
from gearshift.settings import Settings
from gearshift.training import checkpoints, data, forward, losses, tokenization
from gearshift.training.results import register
from gearshift.training.runtime import Run, StepCallback


def gather_prompts(config: DistillConfig) -> tuple[list[Prompt], list[str]]:
    """The inline prompts plus those of the stored trajectories (and their ids, for lineage)."""
    prompts, ids = list(config.prompts), []
    if config.data is not None:
        if not config.store_addr:
            raise ValueError("data needs store_addr")
        for trajectory in data.load_trajectories(config.store_addr, config.data):
            prompts.append(Prompt(query=trajectory.query, domain=trajectory.labels.get("domain", "")))
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
    """One episode per prompt with the student's current weights (a pinned mode is injected)."""
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
            sampling=sampling(config.rollout),
            trajectory_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{run_id}/{step}/{index}")),
        )
        for index, prompt in enumerate(prompts)
    ]
    async with channel(stack.executor_addr, stack) as ch:
        stub = executor_pb2_grpc.ExecutorStub(ch)
        return list(await asyncio.gather(*(solve(stub, request, slots) for request in requests)))


def teacher_logits(student: forward.TargetLogits, batch: tokenization.Batch, owners: list[str], teachers: dict) -> torch.Tensor:
    """The teachers' logits at the student's target positions: row i scored by owners[i]'s
    teacher. Rows ascend in both, so each teacher's sub-batch targets come in the student's order."""
    logits = torch.empty_like(student.logits)
    for source, teacher in teachers.items():
        rows = [row for row, owner in enumerate(owners) if owner == source]
        if not rows:
            continue
        sub = tokenization.Batch(batch.input_ids[rows], batch.attention_mask[rows], batch.target_mask[rows])
        with torch.no_grad():
            logits[torch.isin(student.rows, torch.tensor(rows))] = forward.target_logits(teacher, sub).logits
    return logits


async def train_async(config: DistillConfig, on_step: StepCallback | None = None) -> dict:
    """Runs the distillation; returns the run's result."""
    prompts, trajectory_ids = gather_prompts(config)
    run = Run.start("distill", config, on_step)
    models_dir = Settings().models_dir
    teachers = {source: checkpoints.load_frozen(source, models_dir) for source in {teacher_of(p, config) for p in prompts}}
    pad_id = run.tokenizer.pad_token_id if run.tokenizer.pad_token_id is not None else run.tokenizer.eos_token_id
    run_id, rollout_ids = f"distill-{run.checkpoint_id}", []
    async with rollout_services(run, config.rollout, config.store_addr, config.optim.threads) as (stack, remote):
        for step in run.steps():
            started = time.perf_counter()
            draw = random.Random(config.optim.seed * 1_000_003 + step)
            picked = [prompts[i] for i in draw.sample(range(len(prompts)), k=min(config.batch_size, len(prompts)))]
            episodes = await student_rollouts(stack, picked, config, run_id, step)
            rollout_ids += [t.id for t in episodes]
            encoded = encode_rollouts(run.tokenizer, episodes, config.rollout, config.max_length)
            usable = [(p, e) for p, e in zip(picked, encoded) if e.target_count]
            if not usable:
                run.record(step, 0.0, {"tokens": 0, "sampled_tokens": 0, "updated": False}, started)
                continue
            batch = tokenization.collate([e for _, e in usable], pad_id)
            student = forward.target_logits(run.model, batch)
            owners = [teacher_of(p, config) for p, _ in usable]
            per_token = losses.reverse_kl(student.logits, teacher_logits(student, batch, owners, teachers), config.top_k)
            run.update(step, per_token.mean(), {"tokens": batch.tokens, "sampled_tokens": len(per_token), "updated": True}, started)
            if remote:
                await reload_remote(run, stack)
    domains = sorted({p.domain for p in prompts})
    lineage = trajectory_ids + rollout_ids
    result = run.finalize(lineage, data.snapshot_id(lineage), {"prompts": len(prompts), "domains": len(domains)})
    if run.registers:
        await register(config.store_addr, result)
    return result


def train(config: DistillConfig, on_step: StepCallback | None = None) -> dict:
    """Synchronous entry point (the CLI and the container)."""
    return asyncio.run(train_async(config, on_step))
