"""What every training run does besides its loss: start on its ranks and device, load and wrap
the model, build the optimizer, resume after a crash, accumulate a step's micro-batches, step
with clipping, log metrics (JSON lines), show progress, save the checkpoint with result.json and
register it in the store's registry with its lineage.

A step's batch is global: every rank draws the same batch from the same seed, takes its own
slice (Ranks.shard) and normalises its loss by a count over the whole batch, so the same config
makes the same update on 1 rank or N. Rank 0 alone writes files and talks to the store."""

from __future__ import annotations

import asyncio
import json
import math
import os
import resource
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gearshift import code_version, weights
from gearshift.settings import Settings
from gearshift.training import batching, checkpoints, context_parallel, distributed, forward
from gearshift.training.config import OptimConfig, PolicyJobConfig
from gearshift.training.results import METRICS_FILE, read_metrics, register, write_result

RESUME_DIR = "resume"

StepCallback = Callable[[int, dict], None]
LossOf = Callable[[batching.MicroBatch], torch.Tensor]


def build_optimizer(model: torch.nn.Module, optim: OptimConfig):
    """AdamW over the trainable parameters (its fused kernel: on the CPU a quarter of the time of
    the per-tensor loop), linear warm-up, then constant or linear decay."""
    params = [param for param in model.parameters() if param.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=optim.learning_rate, weight_decay=optim.weight_decay, betas=optim.betas, fused=True)

    def factor(step: int) -> float:
        if optim.warmup_steps and step < optim.warmup_steps:
            return (step + 1) / optim.warmup_steps
        if optim.schedule == "linear":
            return max(0.0, (optim.max_steps - step) / max(1, optim.max_steps - optim.warmup_steps))
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def intra_op_threads(optim: OptimConfig) -> int:
    """optim.threads, or OMP_NUM_THREADS, or this node's cores shared among its ranks."""
    if optim.threads:
        return optim.threads
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    return max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def target_forward(config: PolicyJobConfig, context: context_parallel.Context | None = None) -> checkpoints.Wrap:
    """What a loaded model becomes: a TargetForward with the run's loss chunks and context group."""
    return lambda model: forward.TargetForward(model, config.runtime.loss_chunk_tokens, context)


@dataclass(frozen=True)
class Frozen:
    """A model scored beside the policy: a TargetForward of its own, or None for the policy's base
    with its LoRA adapter off."""

    module: torch.nn.Module | None

    @property
    def lockstep(self) -> bool:
        """Whether every rank must call it on every micro-batch, as often: the policy's base (the
        wrapped policy) or a model sharded across the ranks (FSDP gathers each layer at each call)."""
        return self.module is None or distributed.is_sharded(self.module)


@dataclass
class Run:
    """One training run of a job on this process's rank; create it with Run.start."""

    job: str
    config: PolicyJobConfig
    policy: checkpoints.LoadedPolicy
    module: torch.nn.Module  # policy.model as a TargetForward, wrapped for the ranks (DDP, FSDP)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    ranks: distributed.Ranks
    dtype: torch.dtype  # of the forward and backward (bf16 over float32 master weights, or fp32)
    checkpoint_id: str
    context: context_parallel.Context | None = None  # this rank's context group, which splits each packed micro-batch
    start_step: int = 0
    step: int = 0
    saved_step: int = -1
    on_step: StepCallback | None = None
    last_metrics: dict = field(default_factory=dict)
    routed: list[forward.Targets] = field(default_factory=list)  # the policy's forwards of this micro-batch (an MoE's)
    router_metrics: dict = field(default_factory=dict)  # the last accumulate()'s, for the step's record

    @classmethod
    def start(cls, job: str, config: PolicyJobConfig, on_step: StepCallback | None = None) -> Run:
        """Joins the job's ranks, loads and wraps the model, builds the optimizer, and resumes
        from saved state when there is some."""
        runtime = config.runtime
        ranks = distributed.start(runtime).split_by(runtime.context_parallel, runtime.tensor_parallel)
        torch.manual_seed(config.optim.seed)  # the same initialisation (LoRA's) on every rank
        torch.set_num_threads(intra_op_threads(config.optim))
        dtype = distributed.compute_dtype(config.runtime, ranks.device)
        context = context_parallel.context_of(ranks, runtime)
        policy = checkpoints.load_policy(config.model, Settings().models_dir, dtype, ranks, runtime, target_forward(config, context))
        forward.check_context_parallel(policy.model, runtime)
        policy.model.train()
        module = policy.module  # the TargetForward, sharded (FSDP) or replicated (DDP) before or after its weights came
        optimizer, scheduler = build_optimizer(policy.model, config.optim)  # after sharding: it holds the shards
        output = config.output.dir
        output.mkdir(parents=True, exist_ok=True)
        checkpoint_id = ranks.shared(lambda: config.output.checkpoint_id or _saved_id(output) or str(uuid.uuid4()))
        run = cls(job, config, policy, module, optimizer, scheduler, ranks, dtype, checkpoint_id, context, on_step=on_step)
        if ranks.main:
            (output / "checkpoint_id").write_text(checkpoint_id)
        if config.output.resume:
            run.start_step = run.step = run.saved_step = checkpoints.load_resume(
                output / RESUME_DIR, policy.model, optimizer, scheduler, ranks
            )
            if ranks.main:
                _drop_metrics_after(output, run.start_step)
        return run

    @property
    def model(self) -> torch.nn.Module:
        """The policy itself (its parameters may be shards): state dicts under the same names on any
        number of ranks."""
        return self.policy.model

    @property
    def context_length(self) -> int:
        """The policy's context in tokens (its config's max_position_embeddings)."""
        return int(self.model.config.max_position_embeddings)

    @property
    def tokenizer(self):
        return self.policy.tokenizer

    @property
    def pad_id(self) -> int:
        tokenizer = self.policy.tokenizer
        return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @property
    def output(self) -> Path:
        return self.config.output.dir

    def steps(self) -> Iterator[int]:
        """The steps still to run (1-based), with a progress bar on rank 0."""
        remaining = range(self.start_step + 1, self.config.optim.max_steps + 1)
        if not self.config.output.progress or not self.ranks.main:
            yield from remaining
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        columns = (TextColumn(f"{self.job}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), TextColumn("{task.fields[loss]}"))
        with Progress(*columns, transient=False) as progress:
            task = progress.add_task(self.job, total=self.config.optim.max_steps, completed=self.start_step, loss="")
            for step in remaining:
                yield step
                progress.update(task, advance=1, loss=f"loss {self.last_metrics.get('loss', float('nan')):.4f}")

    def micro_batches(self, examples: list) -> list[batching.MicroBatch]:
        """This rank's examples (tokenization.Encoded) in micro-batches of at most
        runtime.micro_batch_tokens. Every rank gets as many (fillers pad the shorter plans) and
        takes the same path, since FSDP gathers a layer's weights at each call of the layer:
        packed (runtime.packing, on an attention that takes varlen: one decoder call, no padding,
        a shared prefix held once), else padded, where a shared prefix is decoded once in three
        calls, the ranks agreeing on which micro-batches. Packed is the faster where both run
        (benchmarks/packing.py --layers 2 --groups 2 --rounds 3: 7.2 s a step against 7.4 s with
        a shared prefix, 8.0 against 9.3 without)."""
        runtime = self.config.runtime
        attention = self.model.config._attn_implementation
        if runtime.packing and forward.takes_varlen(attention):
            share = attention == forward.BLOCKS  # flash attention's varlen attends to no shared prefix
            plan = batching.pack(examples, runtime.micro_batch_tokens, self.pad_id, share_prefix=share)
            if self.ranks.distributed:
                (count,) = self.ranks.max([len(plan)])
                plan += [self.filler() for _ in range(int(count) - len(plan))]
            return plan
        plan = batching.plan(examples, runtime.micro_batch_tokens, self.pad_id)
        if not self.ranks.distributed:
            return plan
        (count,) = self.ranks.max([len(plan)])
        plan += [batching.filler(self.pad_id) for _ in range(int(count) - len(plan))]
        shares = self.ranks.min([float(forward.shared_prefix(micro.batch) > 0) for micro in plan])
        for micro, share in zip(plan, shares):
            micro.share_prefix = bool(share)
        return plan

    def filler(self) -> batching.MicroBatch:
        """A micro-batch that learns nothing, for a rank with fewer to make the same calls as the
        others: packed under context parallelism (which splits packed batches alone)."""
        return batching.packed_filler(self.pad_id) if self.context is not None else batching.filler(self.pad_id, share_prefix=False)

    def forward(self, micro: batching.MicroBatch, module: torch.nn.Module | None = None, **asked) -> forward.Targets:
        """A micro-batch's Targets (log-probabilities, or what asked asks: forward.through) on this
        rank's device, through the wrapped policy (or module, a TargetForward of a frozen model),
        in the run's precision."""
        module = module or self.module
        batch = micro.batch.to(self.ranks.device)
        with distributed.autocast(module, self.ranks.device, self.dtype):
            targets = forward.through(module, batch, micro.share_prefix, **asked)
        if module is self.module and targets.router_loss is not None:
            self.routed.append(targets)
        return targets

    def frozen(self, source: str) -> Frozen:
        """source as a model scored beside the policy (a teacher, a KL reference). Under LoRA the
        base under the adapter is the policy itself with the adapter off, not a second copy; any
        other source is loaded in the run's precision, sharded across the ranks under FSDP (then
        called in lockstep), whole on every rank's device otherwise."""
        models_dir = Settings().models_dir
        if self.policy.is_lora and weights.resolve(source, models_dir) == self.policy.source_path:
            return Frozen(None)
        wrap = target_forward(self.config, self.context)
        return Frozen(checkpoints.load_frozen(source, models_dir, self.dtype, self.ranks, self.config.runtime, wrap))

    def score(self, frozen: Frozen, micro: batching.MicroBatch, **asked) -> forward.Targets:
        """A frozen model's Targets on a micro-batch, without gradients. The policy's own base
        runs through the wrapped policy, so every rank must call it on every micro-batch (lockstep)."""
        with torch.no_grad():
            if frozen.module is None:
                with self.model.disable_adapter():
                    return self.forward(micro, **asked)
            return self.forward(micro, frozen.module, **asked)

    def head_of(self, frozen: Frozen) -> forward.Head:
        """A frozen model's head (the policy's own for its base)."""
        module = frozen.module or self.module
        return getattr(module, "module", module).head  # DDP wraps the TargetForward

    def accumulate(self, plan: list[batching.MicroBatch], loss_of: LossOf) -> float:
        """Forward and backward of every micro-batch of the plan, gradients accumulating.
        loss_of(micro) runs the micro-batch's forward (Run.forward) and returns its share of the
        step's loss: normalised by a count over the global batch, so the shares of every rank sum
        to it (a filler's is zeroed). An MoE's balancing loss is added to it, each micro-batch's
        share over the step's count of sequences, with the config's router_aux_loss_coef. Returns
        that sum."""
        routers = getattr(self.module, "module", self.module).routers  # the TargetForward's count (DDP wraps it)
        (sequences,) = self.ranks.data_sum([float(sum(len(micro.indices) for micro in plan))]) if routers else (1.0,)
        local, balance = 0.0, 0.0
        expert_tokens = torch.zeros(routers, getattr(self.model.config, "num_experts", 0), dtype=torch.float64)
        for index, micro in enumerate(plan):
            with distributed.gradient_sync(self.module, sync=index == len(plan) - 1):
                self.routed = []
                loss = loss_of(micro)  # also for a filler: every rank calls the model as often
                for targets in self.routed:
                    loss = loss + self.model.config.router_aux_loss_coef * targets.router_loss / max(sequences, 1.0)
                    if not micro.filler:
                        balance += float(targets.router_loss.detach())
                        expert_tokens += targets.expert_tokens.detach().double().cpu()
                if micro.filler:
                    loss = loss * 0.0
                (loss * self.ranks.world_size).backward()  # DDP and FSDP average gradients over the ranks
            local += float(loss.detach())
        self.routed = []
        if routers:
            self.router_metrics = self._router_metrics(balance, expert_tokens, sequences)
        (total,) = self.ranks.token_sum([local])
        if not math.isfinite(total):
            raise FloatingPointError(f"loss is {total}")
        return total

    def _router_metrics(self, balance: float, expert_tokens: torch.Tensor, sequences: float) -> dict:
        """The step's balancing loss (a mean over its sequences) and each router's per-expert
        counts of top-k assignments ([routers, experts]), over every rank."""
        summed = self.ranks.token_sum([balance, *expert_tokens.flatten().tolist()])
        counts = torch.tensor(summed[1:]).reshape(expert_tokens.shape)
        return {"balance_loss": summed[0] / max(sequences, 1.0), "expert_tokens": counts.long().tolist()}

    def optimize(self) -> float:
        """Gradient clipping, optimizer and scheduler step; returns the gradient norm (global)."""
        params = [param for param in self.model.parameters() if param.requires_grad]
        grad_norm = distributed.clip_grad_norm(params, self.config.optim.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def update(self, step: int, plan: list[batching.MicroBatch], loss_of: LossOf, metrics: dict, started: float) -> None:
        """One optimizer step on the plan's loss, then record() the step."""
        loss = self.accumulate(plan, loss_of)
        grad_norm = self.optimize()
        self.record(step, loss, {"grad_norm": grad_norm, **metrics}, started)

    def record(self, step: int, loss: float, metrics: dict, started: float) -> None:
        """Ends a step: a metrics line (rank 0), the resume state every save_every steps, the callback.
        metrics are the whole job's (summed over ranks where each rank saw a part); peak_rss_mib is
        the largest rank's peak resident memory so far."""
        self.step = step
        (peak,) = self.ranks.max([peak_resident_mib()])
        metrics, self.router_metrics = {**self.router_metrics, **metrics, "peak_rss_mib": peak}, {}
        record = {"step": step, "loss": loss, "lr": self.scheduler.get_last_lr()[0], "seconds": time.perf_counter() - started, **metrics}
        if "tokens" in metrics:
            record["tokens_per_second"] = metrics["tokens"] / record["seconds"]
        self.last_metrics = record
        if self.ranks.main:
            with open(self.output / METRICS_FILE, "a") as handle:
                handle.write(json.dumps(record) + "\n")
        if step % self.config.output.save_every == 0:
            self.save_state()
        if self.on_step:
            self.on_step(step, record)

    def save_state(self) -> None:
        checkpoints.save_resume(self.output / RESUME_DIR, self.model, self.optimizer, self.scheduler, self.step, self.ranks)
        self.saved_step = self.step

    def save_weights(self, directory: Path, merged: bool = True) -> None:
        """The policy as a Hugging Face checkpoint in the training precision (every rank calls it)."""
        checkpoints.save_weights(self.policy, directory, self.ranks, self.dtype, merged)

    def save_and_register(self, trajectory_ids: list[str], dataset_snapshot: str, metrics: dict | None = None) -> dict:
        """save_result(), then the checkpoint in the registry where this rank registers (from
        synchronous trainers: asynchronous ones await register() themselves)."""
        result = self.save_result(trajectory_ids, dataset_snapshot, metrics)
        if self.registers:
            asyncio.run(register(self.config.store_addr, result))
        return result

    @property
    def registers(self) -> bool:
        """Whether this rank registers the checkpoint (rank 0, with a store)."""
        return bool(self.ranks.main and self.config.store_addr and self.config.output.register_checkpoint)

    def save_result(self, trajectory_ids: list[str], dataset_snapshot: str, metrics: dict | None = None) -> dict:
        """Saves the weights and the final state, and writes result.json; returns the result."""
        self.save_weights(self.output, self.config.output.merged_weights)
        if self.saved_step != self.step:
            self.save_state()
        return self.ranks.shared(lambda: self._result(trajectory_ids, dataset_snapshot, metrics))

    def _result(self, trajectory_ids: list[str], dataset_snapshot: str, metrics: dict | None) -> dict:
        losses = [record["loss"] for record in read_metrics(self.output)]
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


def peak_resident_mib() -> float:
    """This process's peak resident memory so far (ru_maxrss: KiB on Linux), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _saved_id(output: Path) -> str:
    """The id a previous (interrupted) run of this directory chose, so a resume keeps it."""
    path = output / "checkpoint_id"
    return path.read_text().strip() if path.exists() else ""


def _drop_metrics_after(output: Path, step: int) -> None:
    """A resumed run repeats the steps after its saved state: their old lines go, so the file
    holds one line per step, as an uninterrupted run's does."""
    path = output / METRICS_FILE
    if not path.exists():
        return
    kept = [json.dumps(record) + "\n" for record in read_metrics(output) if record["step"] <= step]
    partial = path.with_suffix(".partial")
    partial.write_text("".join(kept))
    os.replace(partial, path)
