"""Route-then-align SFT (A^2FM, arXiv 2510.12838, section 3.2).

One model learns (1) the classification block for a query and (2) the mode-specific trajectory.
Only correct trajectories are kept; batches are drawn with replacement, re-sampled by difficulty;
tool responses and everything the executor injected are masked out of the loss (see
gearshift.training.tokenization). batch_size is the global batch: under torchrun each rank learns
its slice of the same draw (gearshift.training.runtime).

Example:
    gearshift train sft --config sft.yaml
    torchrun --nproc-per-node 8 -m gearshift.cli train sft --config sft.yaml   # one job on 8 GPUs
    # sft.yaml: {output: {dir: /tmp/ckpt}, store_addr: 127.0.0.1:50056, data: {task_source: gsm}}
"""

from __future__ import annotations

import random
import time
from collections import Counter

import torch
from gearshift.api.common.v1.common_pb2 import Trajectory
from gearshift.jobs.sft.config import SFTConfig
from gearshift.training import batching, data, tokenization
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


def sft_loss_of(run: Run, total_targets: int):
    """The loss of a micro-batch: its target tokens' negative log-likelihood over the step's whole
    count of target tokens (a token mean over the global batch, on 1 rank or N)."""

    def loss_of(micro) -> torch.Tensor:
        return -run.forward(micro).logprobs.sum() / total_targets

    return loss_of


def train(config: SFTConfig, on_step: StepCallback | None = None) -> dict:
    """Reads the configured trajectories from the store (rank 0, for every rank) and trains on them."""
    if not config.store_addr:
        raise ValueError("SFT reads its data from the store: set store_addr")
    run = Run.start("sft", config, on_step)
    return fit(run, config, run.ranks.shared(lambda: data.load_trajectories(config.store_addr, config.data)))


def train_on(config: SFTConfig, trajectories: list[Trajectory], on_step: StepCallback | None = None) -> dict:
    """Trains on the given trajectories (the correct, well-formed ones); returns the run's result."""
    return fit(Run.start("sft", config, on_step), config, trajectories)


def fit(run: Run, config: SFTConfig, trajectories: list[Trajectory]) -> dict:
    kept = [t for t in trajectories if t.reward.correct and (t.reward.format_valid or not config.require_format_valid)]
    routing = tokenization.route_targets(kept)
    examples = [tokenization.encode_trajectory(run.tokenizer, t, config.max_length, t.id in routing) for t in kept]
    usable = [(t, e) for t, e in zip(kept, examples) if e.target_count]
    if not usable:
        raise ValueError(f"no correct trajectory with learnable tokens among {len(trajectories)} read")
    kept, examples = [t for t, _ in usable], [e for _, e in usable]
    weights = sampling_weights(kept, config)
    for step in run.steps():
        started = time.perf_counter()
        draw = random.Random(config.optim.seed * 1_000_003 + step)  # the same batches after a resume, and on every rank
        batch = [examples[i] for i in draw.choices(range(len(examples)), weights=weights, k=config.batch_size)]
        targets = sum(example.target_count for example in batch)
        metrics = {"tokens": sum(len(example.input_ids) for example in batch), "target_tokens": targets}
        run.update(step, run.micro_batches(batching.balanced(run.ranks, batch, lambda example: len(example.input_ids))), sft_loss_of(run, targets), metrics, started)
    ids = [t.id for t in kept]
    levels = Counter(difficulty_of(t) for t in kept)
    return run.save_and_register(ids, data.snapshot_id(ids), {"trajectories": len(kept), "difficulty_levels": len(levels)})
