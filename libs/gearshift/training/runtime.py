"""What every training run does besides its loss: load the model, build the optimizer, resume
after a crash, step with clipping, log metrics (JSON lines), show progress, save the checkpoint
with result.json and register it in the store's registry with its lineage."""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gearshift import code_version
from gearshift.settings import Settings
from gearshift.training import checkpoints
from gearshift.training.config import OptimConfig, PolicyJobConfig
from gearshift.training.results import METRICS_FILE, read_metrics, register, write_result

RESUME_DIR = "resume"

StepCallback = Callable[[int, dict], None]


def build_optimizer(model: torch.nn.Module, optim: OptimConfig):
    """AdamW over the trainable parameters, linear warm-up, then constant or linear decay."""
    params = [param for param in model.parameters() if param.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=optim.learning_rate, weight_decay=optim.weight_decay, betas=optim.betas)

    def factor(step: int) -> float:
        if optim.warmup_steps and step < optim.warmup_steps:
            return (step + 1) / optim.warmup_steps
        if optim.schedule == "linear":
            return max(0.0, (optim.max_steps - step) / max(1, optim.max_steps - optim.warmup_steps))
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@dataclass
class Run:
    """One training run of a job; create it with Run.start."""

    job: str
    config: PolicyJobConfig
    policy: checkpoints.LoadedPolicy
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    checkpoint_id: str
    start_step: int = 0
    step: int = 0
    on_step: StepCallback | None = None
    last_metrics: dict = field(default_factory=dict)

    @classmethod
    def start(cls, job: str, config: PolicyJobConfig, on_step: StepCallback | None = None) -> Run:
        """Loads the model and optimizer, and resumes from saved state when there is some."""
        torch.manual_seed(config.optim.seed)
        torch.set_num_threads(config.optim.threads)
        policy = checkpoints.load_policy(config.model, Settings().models_dir)
        policy.model.train()
        optimizer, scheduler = build_optimizer(policy.model, config.optim)
        output = config.output.dir
        output.mkdir(parents=True, exist_ok=True)
        checkpoint_id = config.output.checkpoint_id or _saved_id(output) or str(uuid.uuid4())
        (output / "checkpoint_id").write_text(checkpoint_id)
        step = checkpoints.load_resume(output / RESUME_DIR, policy.model, optimizer, scheduler) if config.output.resume else 0
        return cls(job, config, policy, optimizer, scheduler, checkpoint_id, start_step=step, step=step, on_step=on_step)

    @property
    def model(self) -> torch.nn.Module:
        return self.policy.model

    @property
    def tokenizer(self):
        return self.policy.tokenizer

    @property
    def output(self) -> Path:
        return self.config.output.dir

    def steps(self) -> Iterator[int]:
        """The steps still to run (1-based), with a progress bar."""
        remaining = range(self.start_step + 1, self.config.optim.max_steps + 1)
        if not self.config.output.progress:
            yield from remaining
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        columns = (TextColumn(f"{self.job}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), TextColumn("{task.fields[loss]}"))
        with Progress(*columns, transient=False) as progress:
            task = progress.add_task(self.job, total=self.config.optim.max_steps, completed=self.start_step, loss="")
            for step in remaining:
                yield step
                progress.update(task, advance=1, loss=f"loss {self.last_metrics.get('loss', float('nan')):.4f}")

    def update(self, step: int, loss: torch.Tensor, metrics: dict, started: float) -> None:
        """One optimizer step on loss, then record() the step."""
        grad_norm = self.optimize(loss)
        self.record(step, loss.item(), {"grad_norm": grad_norm, **metrics}, started)

    def optimize(self, loss: torch.Tensor) -> float:
        """Backward, gradient clipping, optimizer and scheduler step; returns the gradient norm."""
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {float(loss)}")
        loss.backward()
        params = [param for param in self.model.parameters() if param.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.config.optim.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(grad_norm)

    def record(self, step: int, loss: float, metrics: dict, started: float) -> None:
        """Ends a step: a metrics line, the resume state every save_every steps, the callback."""
        self.step = step
        record = {"step": step, "loss": loss, "lr": self.scheduler.get_last_lr()[0], "seconds": time.perf_counter() - started, **metrics}
        if "tokens" in metrics:
            record["tokens_per_second"] = metrics["tokens"] / record["seconds"]
        self.last_metrics = record
        with open(self.output / METRICS_FILE, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        if step % self.config.output.save_every == 0:
            checkpoints.save_resume(self.output / RESUME_DIR, self.model, self.optimizer, self.scheduler, step)
        if self.on_step:
            self.on_step(step, record)

    def finish(self, trajectory_ids: list[str], dataset_snapshot: str, metrics: dict | None = None) -> dict:
        """finalize(), then the registry (from synchronous trainers)."""
        result = self.finalize(trajectory_ids, dataset_snapshot, metrics)
        if self.registers:
            asyncio.run(register(self.config.store_addr, result))
        return result

    @property
    def registers(self) -> bool:
        return bool(self.config.store_addr and self.config.output.register_checkpoint)

    def finalize(self, trajectory_ids: list[str], dataset_snapshot: str, metrics: dict | None = None) -> dict:
        """Saves the weights and writes result.json; returns the result."""
        checkpoints.save_weights(self.policy, self.output)
        checkpoints.save_resume(self.output / RESUME_DIR, self.model, self.optimizer, self.scheduler, self.step)
        history = read_metrics(self.output)
        losses = [record["loss"] for record in history]
        result = {
            "checkpoint_id": self.checkpoint_id,
            "parent_id": self.config.model.parent_checkpoint_id,
            "job": self.job,
            "uri": str(self.output.resolve()),
            "lora": self.policy.is_lora,
            "config": json.loads(self.config.model_dump_json()),
            "code_version": code_version(),
            "dataset_snapshot": dataset_snapshot,
            "trajectory_ids": sorted(trajectory_ids),
            "metrics": {
                "steps": self.step,
                "first_loss": losses[0] if losses else math.nan,
                "final_loss": losses[-1] if losses else math.nan,
                **(metrics or {}),
            },
        }
        return write_result(self.output, result)


def _saved_id(output: Path) -> str:
    """The id a previous (interrupted) run of this directory chose, so a resume keeps it."""
    path = output / "checkpoint_id"
    return path.read_text().strip() if path.exists() else ""
