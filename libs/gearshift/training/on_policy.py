"""On-policy rollouts for the jobs that learn from the model's own episodes (APO, distillation):
the model being trained, served by the embedded platform, runs episodes through the real
executor, router, planner and sandbox, exactly as serving runs them. Every model call of an
episode samples with the rollout settings (routing and planning explore too). Under torchrun,
against a running executor (an inference fleet) every rank runs its own share of a step's
episodes and learns from them; in process rank 0 runs them all and every rank learns its share.

With rollout.max_async_steps > 0 (prime-rl's async level) the episodes of step n+1 are generated
while step n trains (Rollouts.batches): a batch whose generation started when the fleet's policy
carried update v is trained at step s only if s - 1 - v <= max_async_steps (its staleness, in
metrics.jsonl with the step's timeline), and the log-probabilities the fleet returned with each
sampled token weigh (APO) or mask (both) the tokens the trainer would not have sampled
(losses.policy_loss). An episode that fails or times out is dropped and counted (solve_each), and
every rank agrees each step that it may go on (Rollouts.batches): a rank whose rollouts failed
stops every rank, none is left waiting in a collective.

Against a running executor (rollout.executor_addr) the policy server it calls gets the new weights
after every update without a restart, by the route its engine has (RemotePolicy): vLLM serves
each step's LoRA adapter under a new name, or reloads full weights in place (or receives them
over NCCL, weight_transfer.py); the built-in server loads the saved checkpoint. The time it takes is the step's sync_seconds in metrics.jsonl."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import torch
import torch.distributed as dist

from gearshift import weights
from gearshift.api.common.v1.common_pb2 import Sampling, Trajectory, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.embedded import EmbeddedPolicy, embedded
from gearshift.errors import FailedPrecondition
from gearshift.policy_client import VLLM, PolicyClient
from gearshift.sampling import derived_seed
from gearshift.settings import ExecutorSettings, PolicyServerSettings, Settings
from gearshift.topology import SERVICE_NAMES
from gearshift.training import checkpoints, distributed, tokenization
from gearshift.training.config import RolloutConfig
from gearshift.training.runtime import Run, intra_op_threads
from gearshift.training.weight_transfer import VllmWeights, require_cuda

SERVED_NAME = "policy-in-training"
SERVING_DIR = "serving"  # in the run's output dir: what a remote server loads (the checkpoints volume)
ADAPTER_PREFIX = "adapter-step-"
T = TypeVar("T")
log = logging.getLogger("gearshift.training.on_policy")


def sampling(rollout: RolloutConfig, seed: int, trajectory_id: str) -> Sampling:
    """A rollout's sampling, seeded from the run's seed and the rollout's id: a rerun of the run
    (or a resumed step) samples the same episodes."""
    return Sampling(temperature=rollout.temperature, top_p=rollout.top_p, seed=derived_seed(seed, trajectory_id))


def encode_rollouts(tokenizer, rollouts: list[Trajectory], rollout: RolloutConfig, max_length: int) -> list[tokenization.Encoded]:
    """The rollouts' tokens and masks; a text-protocol rollout has no end-of-turn target (serving
    stops at stop words, so the policy never sampled one), a native one learns each generation's
    end as the chat template writes it (the engine stopped there). With exact_tokens only the sampled tokens are learned, so
    rollouts that kept none mean a server that does not return them: an error, not silence."""
    if rollout.exact_tokens and rollouts and not any(turn.sampled or turn.token_ids for t in rollouts for turn in t.turns):
        raise FailedPrecondition(
            "no rollout kept its sampled token ids: serve the policy with the built-in server or vLLM and keep "
            "GEARSHIFT_POLICY_CLIENT__RETURN_TOKEN_IDS on, or set rollout.exact_tokens: false"
        )
    return [tokenization.encode_trajectory(tokenizer, t, max_length, exact=rollout.exact_tokens, end_of_turn=False) for t in rollouts]


def save_adapter(run: Run, directory: Path) -> None:
    """The LoRA adapter alone (peft's files) in directory, from rank 0; every rank calls it (the
    shards are gathered), and only the trainable weights travel, not the frozen base. Written
    beside and renamed: a server never reads half an adapter."""
    state = checkpoints.full_state(run.model, run.ranks, trainable_only=True)
    if not run.ranks.main:
        return
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    checkpoints.save_adapter(run.model, state, partial)  # an MoE's experts' LoRA in vLLM's per-expert layout
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(partial, directory)


def drop_other_adapters(current: Path, keep: int = 0) -> None:
    """Deletes the step adapters beside current but the keep newest: the server no longer serves
    them, and vLLM reads an adapter's files only when it loads it. Asynchronous rollouts keep as
    many as their staleness bound: a request accepted on an older version may still be running,
    and vLLM's worker reloads that version from its files (a missing folder kills its engine)."""
    others = sorted(other for other in current.parent.glob(ADAPTER_PREFIX + "*") if other != current)
    for other in others[: max(0, len(others) - keep)]:
        shutil.rmtree(other, ignore_errors=True)


@dataclass
class RemotePolicy:
    """A running policy server that samples the run's episodes, and the route by which it gets
    the run's weights after each update, chosen once per run from the engine it runs:
    - vLLM, LoRA run: rank 0 saves the adapter alone in output/serving/adapter-step-NNNNNNNN and
      vLLM serves it as `<alias>@<step>`, unloading the alias's older versions
      (PolicyClient.serve_adapter). alias is the model name the stack's policy clients ask for
      (policy_client.model: set the same on this job and on the executor, router and planner),
      and they follow it to its newest version. A new name per step, because vLLM keeps the
      prefix blocks it cached under a name reloaded in place;
    - vLLM, full weights: the checkpoint saved in output/serving, reloaded into the running model
      (collective_rpc reload_weights, then the prefix cache dropped; vLLM needs
      VLLM_SERVER_DEV_MODE=1): the one full-weight route of vLLM 0.32.0 that works on its CPU
      build, where sleep/wake_up are no-ops and the weight-transfer engines need NCCL or CUDA;
    - the built-in server: the checkpoint (a LoRA adapter merged in) in output/serving,
      POST /v1/load.
    The server reads the files from the run's output dir (on Kubernetes the checkpoints volume,
    which the policy pods mount too). With rollout.weight_transfer "nccl", vLLM gets full weights
    over NCCL instead, bucket by bucket from the shards, no file written (weight_transfer.py)."""

    client: PolicyClient | None  # rank 0's
    adapters: bool  # the adapter alone travels (vLLM and a LoRA run); the same on every rank
    alias: str
    admin_token: str | None = None  # the built-in server's, for /v1/load
    kept_versions: int = 0  # older adapters whose files stay (rollout.max_async_steps)
    nccl: VllmWeights | None = None  # full weights over NCCL (on every rank), else through the volume

    async def publish(self, run: Run, step: int) -> None:
        """Gives the server the run's current weights as step's (every rank calls it)."""
        if self.adapters:
            directory = run.output / SERVING_DIR / f"{ADAPTER_PREFIX}{step:08d}"
            save_adapter(run, directory)
            if self.client is not None:
                await self.client.serve_adapter(self.alias, step, str(directory.resolve()))
                drop_other_adapters(directory, self.kept_versions)
        elif self.nccl is not None:
            await self.nccl.publish(run, step)
        else:
            serving = run.output / SERVING_DIR
            run.save_weights(serving)
            if self.client is not None:
                await self.client.switch_weights(str(serving.resolve()), self.admin_token)
        run.ranks.barrier()


@contextlib.asynccontextmanager
async def remote_policy(run: Run, settings: Settings, weight_transfer: str = "volume") -> AsyncIterator[RemotePolicy]:
    """The policy server settings.policy_client names, its engine asked once on rank 0; full
    weights reach it through the volume, or with weight_transfer "nccl" over NCCL (vLLM only)."""
    if weight_transfer == "nccl":
        require_cuda(run.ranks.device)
    client = PolicyClient.from_settings(settings) if run.ranks.main else None
    nccl = None
    try:
        engine = await client.engine() if client is not None else None
        adapters = run.ranks.shared(lambda: engine == VLLM and run.policy.is_lora)
        alias = settings.policy_client.model
        if client is not None and adapters and alias in await client.models():
            raise FailedPrecondition(
                f"vLLM serves {alias!r} itself, so rollouts asking for it would never reach the trained adapter: name the "
                f"policy by an alias vLLM does not serve, the same for this job and for the executor, router and planner "
                f"(GEARSHIFT_POLICY_CLIENT__MODEL={SERVED_NAME})"
            )
        if weight_transfer == "nccl" and not adapters:
            if not run.ranks.shared(lambda: engine == VLLM):
                raise FailedPrecondition("rollout.weight_transfer 'nccl' streams into vLLM's NCCL weight-transfer engine: the policy server is not vLLM")
            nccl = await VllmWeights.open(run, client)
        admin = settings.policy_server.admin_token
        yield RemotePolicy(client, adapters, alias, admin.get_secret_value() if admin else None, nccl=nccl)
    finally:
        if nccl is not None:
            await nccl.close()
        if client is not None:
            await client.aclose()


def gathered(run: Run, value: T) -> list[T]:
    """value from every rank, in rank order (pickled: small objects of this job)."""
    if not run.ranks.distributed:
        return [value]
    values: list = [None] * run.ranks.world_size
    dist.all_gather_object(values, value)
    return values


class RolloutsFailed(RuntimeError):
    """A step's rollouts failed on some rank: every rank stops."""


@dataclass
class Batch(Generic[T]):
    """A step's episodes as this rank has them, the policy that generated them and when (seconds
    since the epoch, comparable across ranks and processes)."""

    step: int
    items: T
    version: int  # the last update the sampling policy carried when the generation started
    generation_started: float
    generation_ended: float
    wait_seconds: float = 0.0  # how long the trainer waited for it

    @property
    def staleness(self) -> int:
        """Updates between the weights that generated the batch and those it updates (0: on-policy)."""
        return self.step - 1 - self.version

    def timeline(self) -> dict:
        return {"policy_version": self.version, "staleness": self.staleness, "generation_started": self.generation_started,
                "generation_ended": self.generation_ended, "wait_seconds": self.wait_seconds}


class Ahead(Generic[T]):
    """Batches generated ahead of the trainer, at most max_async updates stale: the batch of step s
    starts once the sampling policy carries update s - 1 - max_async or a newer one, so it is
    generated while the steps before it train. Its episodes may sample newer weights than the one
    it started with (the fleet follows every publish): the staleness recorded is the largest."""

    def __init__(self, rollouts: Rollouts, steps: Sequence[int], generate: Callable[[Settings | None, int], Awaitable[T]], max_async: int):
        self.rollouts, self.max_async = rollouts, max_async
        self.ready: asyncio.Queue[Batch[T] | BaseException] = asyncio.Queue()
        self.producer = asyncio.create_task(self._produce(list(steps), generate))

    async def _produce(self, steps: list[int], generate: Callable[[Settings | None, int], Awaitable[T]]) -> None:
        rollouts = self.rollouts
        try:
            for step in steps:
                async with rollouts.changed:
                    await rollouts.changed.wait_for(lambda: rollouts.version >= step - 1 - self.max_async)
                version, started = rollouts.version, time.time()
                items = await generate(rollouts.settings, step)
                self.ready.put_nowait(Batch(step, items, version, started, time.time()))
        except Exception as exc:  # handed to the trainer, which raises it
            self.ready.put_nowait(exc)

    async def next(self, step: int) -> Batch[T]:
        asked = time.time()
        batch = await self.ready.get()
        if isinstance(batch, BaseException):
            raise batch
        if batch.step != step or batch.staleness > self.max_async:
            raise RuntimeError(f"step {step} got the batch of step {batch.step} (staleness {batch.staleness}, bound {self.max_async})")
        batch.wait_seconds = time.time() - asked
        return batch

    async def close(self) -> None:
        self.producer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.producer


@dataclass
class Rollouts:
    """Where a run's episodes come from, and after each update makes the policy that samples them
    carry the new weights. Against a running executor (an inference fleet) every rank runs its own
    share of them; in process rank 0 runs them, for every rank. The sampling policy is one of:
    - an in-process stack whose built-in server generates with the very module being trained
      (one CPU process: rollouts and updates alternate, nothing to copy);
    - the same stack generating with a CPU copy on rank 0, refreshed from the gathered weights
      after each update (the module is sharded across ranks, or on a GPU the built-in server
      does not use);
    - a running executor whose policy server gets the saved weights (RemotePolicy).
    remote and copied are the same on every rank: they decide the collectives publish() makes."""

    run: Run
    remote: RemotePolicy | None
    copied: bool
    settings: Settings | None = None  # the stack's, on rank 0 (and on every rank when remote)
    server: EmbeddedPolicy | None = None  # the in-process built-in server, on rank 0
    copy: torch.nn.Module | None = None  # rank 0's serving copy when copied
    version: int = 0  # the last update the sampling policy carries
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)  # notified when version moves

    @property
    def every_rank(self) -> bool:
        """Whether each rank runs its own share of the episodes (through the executor), not rank 0 all."""
        return self.remote is not None

    def share(self, items: list[T]) -> tuple[int, list[T]]:
        """The items this rank rolls out and the index of its first: its slice of them when every
        rank rolls out, else all of them (rank 0 runs them for every rank)."""
        if not self.every_rank:
            return 0, items
        return (len(items) * self.run.ranks.rank) // self.run.ranks.world_size, self.run.ranks.shard(items)

    async def collect(self, episodes: Callable[[Settings], Awaitable[T]]) -> T:
        """await episodes(settings) on rank 0; every rank gets the result, or raises where rank 0's
        failed (no rank is left waiting for a result that will not come)."""
        result, error = None, None
        if self.run.ranks.main:
            try:
                result = await episodes(self.settings)
            except Exception as exc:
                error = exc
        shared = self.run.ranks.shared(lambda: RolloutsFailed(f"rank 0's rollouts failed: {error}") if error else result)
        if error is not None:
            raise error
        if isinstance(shared, RolloutsFailed):
            raise shared
        return shared

    def everyones(self, items: list[T]) -> list[T]:
        """Every rank's items, in rank order, on every rank, when each rank rolled out its own share
        (so a step's work can be balanced over the ranks); else items, which every rank has."""
        return [item for share in gathered(self.run, items) for item in share] if self.every_rank else items

    async def agreed(self, step: int, get: Callable[[int], Awaitable[Batch[T]]]) -> Batch[T]:
        """get(step), once every rank knows that every rank has its batch (a sum across ranks when
        each rolls out its own): a rank whose rollouts failed raises, and so does every other."""
        try:
            batch, error = await get(step), None
        except Exception as exc:
            batch, error = None, exc
        if self.every_rank and self.run.ranks.distributed:
            (failed,) = self.run.ranks.sum([float(error is not None)])
            if failed and error is None:
                raise RolloutsFailed(f"step {step}: the rollouts of {int(failed)} other rank(s) failed (their logs say why)")
        if error is not None:
            raise error
        return batch

    @contextlib.asynccontextmanager
    async def batches(self, steps: Sequence[int], generate: Callable[[Settings | None, int], Awaitable[T]],
                      max_async: int = 0) -> AsyncIterator[Callable[[int], Awaitable[Batch[T]]]]:
        """A function giving each step's batch in turn: generate(settings, step) is this rank's
        episodes of step (every rank's own share, or rank 0's for every rank in process). max_async
        0: generated when asked, with the newest weights (synchronous); else generated ahead while
        the trainer trains (Ahead), at most max_async updates stale."""
        if not max_async:

            async def now(step: int) -> Batch[T]:
                started = time.time()
                if self.every_rank:
                    items = await generate(self.settings, step)
                else:
                    items = await self.collect(lambda settings: generate(settings, step))
                ended = time.time()
                return Batch(step, items, self.version, started, ended, ended - started)

            yield lambda step: self.agreed(step, now)
            return
        if not self.every_rank:
            raise FailedPrecondition("asynchronous rollouts need an inference fleet: set rollout.executor_addr")
        ahead = Ahead(self, steps, generate, max_async)
        try:
            yield lambda step: self.agreed(step, ahead.next)
        finally:
            await ahead.close()

    async def unchanged(self, step: int) -> None:
        """A step that made no update: the sampling policy's weights are step's already."""
        await self._moved(step)

    async def _moved(self, step: int) -> None:
        async with self.changed:
            self.version = step
            self.changed.notify_all()

    async def publish(self, step: int | None = None) -> float:
        """Makes the sampling policy carry the run's current weights, those of step (default: the
        last recorded); returns the seconds taken. Every rank calls it (gathering the weights is
        a collective)."""
        started = time.perf_counter()
        step = self.run.step if step is None else step
        if self.remote is not None:
            await self.remote.publish(self.run, step)
            await self._moved(step)
            return time.perf_counter() - started
        if self.copied:
            state = checkpoints.full_state(self.run.model, self.run.ranks, trainable_only=True)
            if self.run.ranks.main:
                checkpoints.load_full_state(self.copy, state, trainable_only=True)
        if self.server is not None:
            self.server.weights_changed()  # prefixes cached with the old weights are stale
        await self._moved(step)
        return time.perf_counter() - started


def serves_itself(run: Run) -> bool:
    """Whether the built-in server can generate with the module being trained: whole (not
    sharded) and on the CPU, where the built-in server runs."""
    return run.ranks.device.type == "cpu" and not distributed.is_sharded(run.module)


def serving_copy(run: Run) -> torch.nn.Module | None:
    """rank 0's CPU float32 copy of the policy with the run's current weights (a collective)."""
    state = checkpoints.full_state(run.model, run.ranks)
    if not run.ranks.main:
        return None
    copy = checkpoints.load_policy(run.config.model.model_copy(update={"gradient_checkpointing": False}), Settings().models_dir).model
    checkpoints.load_full_state(copy, state)
    return copy.eval()


@contextlib.asynccontextmanager
async def rollout_services(run: Run, rollout: RolloutConfig, store_addr: str) -> AsyncIterator[Rollouts]:
    """The run's Rollouts: through rollout.executor_addr when set (its policy server at
    rollout.policy_url, else policy_client.url), else an in-process stack on rank 0 whose built-in
    server serves the training weights. Rollouts are stored in the job's store when it has one.
    The sampling policy starts with the run's weights."""
    settings = Settings()
    if rollout.executor_addr:
        stack = settings.model_copy(update={"executor_addr": rollout.executor_addr})
        stack = stack.with_policy(rollout.policy_url) if rollout.policy_url else stack
        async with remote_policy(run, stack, rollout.weight_transfer) as server:
            server.kept_versions = rollout.max_async_steps
            rollouts = Rollouts(run, remote=server, copied=False, settings=stack, version=run.start_step)
            await rollouts.publish(run.start_step)  # the remote server starts from this run's weights
            yield rollouts
        return
    copied = not serves_itself(run)
    copy = serving_copy(run) if copied else None
    if not run.ranks.main:
        yield Rollouts(run, remote=None, copied=copied, version=run.start_step)
        return
    threads = intra_op_threads(run.config.optim)
    serving = PolicyServerSettings(model=str(run.output), served_model_name=SERVED_NAME, threads=threads, max_tokens_cap=4096)
    model = copy if copied else run.model
    served = weights.LoadedModel(model=model, tokenizer=run.tokenizer, source="training", path=run.output, load_seconds=0.0)
    # A rollout is the policy's own episode: no answer asked for at the step limit (budget forcing
    # serves users; in training it would add tokens the policy wrote only because it was asked).
    executor = ExecutorSettings(temperature=rollout.temperature, top_p=rollout.top_p, max_tokens_per_turn=rollout.max_tokens_per_turn,
                                answer_at_step_limit=False)
    planner = settings.planner.model_copy(update={"max_tokens": max(16, rollout.max_tokens_per_turn)})  # a plan is a turn too
    local = settings.model_copy(update={"policy_server": serving, "executor": executor, "planner": planner, "metrics_port": 0})
    services = SERVICE_NAMES
    if store_addr:
        local = local.model_copy(update={"store_addr": store_addr})
        services = tuple(name for name in SERVICE_NAMES if name != "store")
    async with embedded(local, services, policy_weights=served) as platform:
        yield Rollouts(run, remote=None, copied=copied, settings=platform.settings, server=platform.policy, copy=copy, version=run.start_step)


async def solve(stub: executor_pb2_grpc.ExecutorStub, request: executor_pb2.SolveRequest, slots: asyncio.Semaphore,
                timeout: float | None = None) -> Trajectory:
    """Runs one episode (at most timeout seconds once it has a slot); returns the stored trajectory
    from the final event."""
    async with slots, asyncio.timeout(timeout):
        async for item in stub.Solve(request):
            if item.HasField("final"):
                return item.final.trajectory
    raise RuntimeError(f"the executor ended episode {request.trajectory_id} without a final event")


UNFINISHED = (TrajectoryStatus.TRAJECTORY_STATUS_FAILED, TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED)


async def solve_each(stub: executor_pb2_grpc.ExecutorStub, requests: list[executor_pb2.SolveRequest], slots: asyncio.Semaphore,
                     timeout: float) -> list[Trajectory | None]:
    """Every request's episode, None for one that failed (the executor's error, an episode stored
    as failed or cancelled, a timeout): it is dropped, logged and counted by the job, never the
    job's end. An episode is one sample of many; the step learns from the rest."""
    results = await asyncio.gather(*(solve(stub, request, slots, timeout) for request in requests), return_exceptions=True)
    finished: list[Trajectory | None] = []
    for request, result in zip(requests, results):
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result  # cancelled: the job is stopping
        if isinstance(result, Exception) or result.status in UNFINISHED:
            why = f"{type(result).__name__}: {result}" if isinstance(result, Exception) else f"stored {TrajectoryStatus.Name(result.status)}"
            log.warning("episode %s dropped: %s", request.trajectory_id, why.splitlines()[0][:300])
            finished.append(None)
        else:
            finished.append(result)
    return finished


