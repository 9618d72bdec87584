"""Multi-teacher on-policy distillation (Agents-A1, stage 3; the on-policy distillation loss of
Agarwal et al., "On-Policy Distillation of Language Models", arXiv 2306.13649).

Each step the student samples a continuation of each prompt with its current weights
(transformers' generate, on this machine); a domain map picks each prompt's teacher; the loss is
the per-token reverse KL(student || teacher) on the student's own tokens, over the full
vocabulary or the student's top-k, averaged over the sampled tokens. A forced mode's injected
prefix is part of the prompt and never learned.

Example:
    gearshift train distill --config distill.yaml
    # distill.yaml: {output: {dir: /tmp/student}, teachers: {math: /ckpt/math, qa: /ckpt/qa},
    #                prompts: [{query: "What is 17*23?", domain: math}]}
"""

from __future__ import annotations

import random
import time

import torch
from gearshift.jobs.distill.config import DistillConfig, Prompt
from gearshift.protocol import a2fm
from gearshift.protocol.modes import MODE_OF
from gearshift.settings import Settings
from gearshift.training import checkpoints, data, forward, losses, tokenization
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


def prompt_encoding(tokenizer, prompt: Prompt) -> tokenization.Encoded:
    """The serving prompt, plus the forced prefix when the prompt pins a mode (never a target)."""
    segments = []
    if prompt.mode:
        mode = MODE_OF[prompt.mode]
        segments.append(tokenization.Segment(a2fm.episode_prefix(mode, a2fm.FORCED_JUSTIFICATION[mode]), target=False))
    return tokenization.encode(tokenizer, prompt.query, segments, end_of_turn=False)


@torch.no_grad()
def sample(model, tokenizer, prompts: list[tokenization.Encoded], config: DistillConfig) -> list[tokenization.Encoded]:
    """The student's continuations, each appended to its prompt as target tokens (up to and
    including the end-of-turn token when one was sampled)."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(p.input_ids) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):  # left padding: generation continues every row at the end
        ids[row, width - len(prompt.input_ids):] = torch.tensor(prompt.input_ids)
        attention[row, width - len(prompt.input_ids):] = 1
    model.eval()
    sampled = model.generate(
        input_ids=ids,
        attention_mask=attention,
        max_new_tokens=config.max_new_tokens,
        do_sample=config.temperature > 0,
        temperature=config.temperature or None,
        top_p=config.top_p,
        pad_token_id=pad_id,
    )[:, width:]
    model.train()
    stops = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    out = []
    for prompt, row in zip(prompts, sampled.tolist()):
        cut = next((i + 1 for i, token in enumerate(row) if token in stops), len(row))
        out.append(tokenization.Encoded(prompt.input_ids + row[:cut], [False] * len(prompt.input_ids) + [True] * cut))
    return out


def train(config: DistillConfig, on_step: StepCallback | None = None) -> dict:
    """Runs the distillation; returns the run's result."""
    prompts, trajectory_ids = gather_prompts(config)
    run = Run.start("distill", config, on_step)
    models_dir = Settings().data_dir / "models"
    teachers = {source: checkpoints.load_frozen(source, models_dir) for source in {teacher_of(p, config) for p in prompts}}
    encoded = [prompt_encoding(run.tokenizer, p) for p in prompts]
    pad_id = run.tokenizer.pad_token_id if run.tokenizer.pad_token_id is not None else run.tokenizer.eos_token_id
    for step in run.steps():
        started = time.perf_counter()
        draw = random.Random(config.optim.seed * 1_000_003 + step)
        picks = draw.sample(range(len(prompts)), k=min(config.batch_size, len(prompts)))
        batch = tokenization.collate(sample(run.model, run.tokenizer, [encoded[i] for i in picks], config), pad_id)
        student = forward.target_logits(run.model, batch)
        teacher_logits = torch.empty_like(student.logits)
        for source, teacher in teachers.items():
            rows = [row for row, i in enumerate(picks) if teacher_of(prompts[i], config) == source]
            if not rows:
                continue
            # rows ascend, so the sub-batch's targets come in the order of the student's
            sub = tokenization.Batch(batch.input_ids[rows], batch.attention_mask[rows], batch.target_mask[rows])
            with torch.no_grad():
                teacher_logits[torch.isin(student.rows, torch.tensor(rows))] = forward.target_logits(teacher, sub).logits
        per_token = losses.reverse_kl(student.logits, teacher_logits, config.top_k)
        loss = per_token.mean()
        run.update(step, loss, {"tokens": batch.tokens, "sampled_tokens": len(per_token)}, started)
    domains = sorted({p.domain for p in prompts})
    return run.finish(trajectory_ids, data.snapshot_id(trajectory_ids) if trajectory_ids else "", {"prompts": len(prompts), "domains": len(domains)})
