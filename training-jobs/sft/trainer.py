"""Route-then-align SFT (A^2FM, arXiv 2510.12838, section 3.2).

One model learns (1) the classification block for a query and (2) the mode-specific trajectory.
Only correct trajectories are kept; batches are drawn with replacement, re-sampled by difficulty;
tool responses and everything the executor injected are masked out of the loss (see
gearshift.training.tokenization).

Example:
    gearshift train sft --config sft.yaml
    # sft.yaml: {output: {dir: /tmp/ckpt}, store_addr: 127.0.0.1:50056, data: {task_source: gsm}}
"""

from __future__ import annotations

import random
import time
from collections import Counter

import torch
from gearshift.api.common.v1.common_pb2 import Trajectory
from gearshift.jobs.sft.config import SFTConfig
from gearshift.training import data, forward, losses, tokenization
from gearshift.training.runtime import Run, StepCallback

UNLABELLED = ""


def difficulty_of(trajectory: Trajectory) -> str:
    return trajectory.labels.get("difficulty", UNLABELLED)


def sampling_weights(trajectories: list[Trajectory], config: SFTConfig) -> list[float]:
    """Per-trajectory draw weights: 1 / (size of its difficulty level) when balancing, times
    the configured weight of its level."""
    levels = [difficulty_of(t) for t in trajectories]
    counts = Counter(levels)
    return [
        (1.0 / counts[level] if config.balance_difficulty else 1.0) * config.difficulty_weights.get(level, 1.0)
        for level in levels
    ]


def sft_loss(model, batch: tokenization.Batch) -> tuple[torch.Tensor, int]:
    """Token-mean cross entropy over the batch's target tokens, and how many there were."""
    out = forward.target_logits(model, batch)
    return losses.cross_entropy(out.logits, out.tokens, torch.ones_like(out.tokens, dtype=torch.bool)), len(out.tokens)


def train(config: SFTConfig, on_step: StepCallback | None = None) -> dict:
    """Reads the configured trajectories from the store and trains on them."""
    if not config.store_addr:
        raise ValueError("SFT reads its data from the store: set store_addr")
    return train_on(config, data.load_trajectories(config.store_addr, config.data), on_step)


def train_on(config: SFTConfig, trajectories: list[Trajectory], on_step: StepCallback | None = None) -> dict:
    """Trains on the given trajectories (the correct, well-formed ones); returns the run's result."""
    run = Run.start("sft", config, on_step)
    kept = [t for t in trajectories if t.reward.correct and (t.reward.format_valid or not config.require_format_valid)]
    routing = tokenization.route_targets(kept)
    examples = [tokenization.encode_trajectory(run.tokenizer, t, config.max_length, t.id in routing) for t in kept]
    usable = [(t, e) for t, e in zip(kept, examples) if e.target_count]
    if not usable:
        raise ValueError(f"no correct trajectory with learnable tokens among {len(trajectories)} read")
    kept, examples = [t for t, _ in usable], [e for _, e in usable]
    weights = sampling_weights(kept, config)
    pad_id = run.tokenizer.pad_token_id if run.tokenizer.pad_token_id is not None else run.tokenizer.eos_token_id
    for step in run.steps():
        started = time.perf_counter()
        draw = random.Random(config.optim.seed * 1_000_003 + step)  # the same batches after a resume
        picks = draw.choices(range(len(examples)), weights=weights, k=config.batch_size)
        batch = tokenization.collate([examples[i] for i in picks], pad_id)
        loss, targets = sft_loss(run.model, batch)
        run.update(step, loss, {"tokens": batch.tokens, "target_tokens": targets}, started)
    ids = [t.id for t in kept]
    levels = Counter(difficulty_of(t) for t in kept)
    return run.finish(ids, data.snapshot_id(ids), {"trajectories": len(kept), "difficulty_levels": len(levels)})

