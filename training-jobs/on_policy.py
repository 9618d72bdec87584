"""On-policy rollouts for the jobs that learn from the model's own episodes (APO, distillation):
the model being trained, served by the embedded platform, runs episodes through the real
executor, router, planner and sandbox, exactly as serving runs them. Every model call of an
episode samples with the rollout settings (routing and planning explore too). Under torchrun,
rank 0 runs the episodes and every rank learns from its share of them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch

from gearshift import weights
from gearshift.api.common.v1.common_pb2 import Sampling, Trajectory
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.embedded import embedded
from gearshift.errors import FailedPrecondition
from gearshift.policy_client import PolicyClient
from gearshift.settings import ExecutorSettings, PolicyServerSettings, Settings
from gearshift.topology import SERVICE_NAMES
from gearshift.training import checkpoints, distributed, tokenization
from gearshift.training.config import RolloutConfig
from gearshift.training.runtime import Run, intra_op_threads

if TYPE_CHECKING:
    from gearshift.services.policy_server.core import PolicyEngine

SERVED_NAME = "policy-in-training"
T = TypeVar("T")


def sampling(rollout: RolloutConfig) -> Sampling:
    return Sampling(temperature=rollout.temperature, top_p=rollout.top_p)


def encode_rollouts(tokenizer, rollouts: list[Trajectory], rollout: RolloutConfig, max_length: int) -> list[tokenization.Encoded]:
    """The rollouts' tokens and masks, with no end-of-turn target (serving stops at stop words,
    so the policy never sampled one). With exact_tokens only the sampled tokens are learned, so
    rollouts that kept none mean a server that does not return them: an error, not silence."""
    if rollout.exact_tokens and rollouts and not any(turn.sampled for t in rollouts for turn in t.turns):
        raise FailedPrecondition(
            "no rollout kept its sampled token ids: serve the policy with the built-in server or vLLM and keep "
            "GEARSHIFT_POLICY_CLIENT__RETURN_TOKEN_IDS on, or set rollout.exact_tokens: false"
        )
    return [
        tokenization.encode(tokenizer, t.query, tokenization.assistant_segments(t), end_of_turn=False, max_length=max_length,
                            exact=rollout.exact_tokens)
        for t in rollouts
    ]


@dataclass
class Rollouts:
    """Where a run's episodes come from. Rank 0 runs them, for every rank (episodes are gRPC calls
    to an executor, their compute is the policy server's), and after each update makes the
    policy that samples them carry the new weights:
    - an in-process stack whose built-in server generates with the very module being trained
      (one CPU process: rollouts and updates alternate, nothing to copy);
    - the same stack generating with a CPU copy on rank 0, refreshed from the gathered weights
      after each update (the module is sharded across ranks, or on a GPU the built-in server
      does not use);
    - a running executor whose policy server loads the saved weights (POST /v1/load).
    remote and copied are the same on every rank: they decide the collectives publish() makes."""

    run: Run
    remote: bool
    copied: bool
    settings: Settings | None = None  # the stack's, on rank 0 (and on every rank when remote)
    engine: PolicyEngine | None = None  # the in-process built-in server, on rank 0
    copy: torch.nn.Module | None = None  # rank 0's serving copy when copied

    async def collect(self, episodes: Callable[[Settings], Awaitable[T]]) -> T:
        """await episodes(settings) on rank 0; every rank gets the result."""
        result = await episodes(self.settings) if self.run.ranks.main else None
        return self.run.ranks.shared(lambda: result)

    async def publish(self) -> float:
        """Makes the sampling policy carry the run's current weights; returns the seconds taken.
        Every rank calls it (gathering the weights is a collective)."""
        started = time.perf_counter()
        if self.remote:
            serving = self.run.output / "serving"
            self.run.save_weights(serving)
            if self.run.ranks.main:
                async with PolicyClient.from_settings(self.settings) as policy:
                    await policy.load(str(serving.resolve()))
            self.run.ranks.barrier()
            return time.perf_counter() - started
        if self.copied:
            state = checkpoints.full_state(self.run.model, self.run.ranks, trainable_only=True)
            if self.run.ranks.main:
                checkpoints.load_full_state(self.copy, state, trainable_only=True)
        if self.engine is not None:
            self.engine.weights_changed()  # prefixes cached with the old weights are stale
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
    """The run's Rollouts: through rollout.executor_addr when set, else an in-process stack on
    rank 0 whose built-in server serves the training weights. Rollouts are stored in the job's
    store when it has one. The sampling policy starts with the run's weights."""
    settings = Settings()
    if rollout.executor_addr:
        remote = settings.model_copy(update={"executor_addr": rollout.executor_addr})
        rollouts = Rollouts(run, remote=True, copied=False, settings=remote.with_policy(rollout.policy_url) if rollout.policy_url else remote)
        await rollouts.publish()  # the remote server starts from this run's weights
        yield rollouts
        return
    copied = not serves_itself(run)
    copy = serving_copy(run) if copied else None
    if not run.ranks.main:
        yield Rollouts(run, remote=False, copied=copied)
        return
    from gearshift.services.policy_server.core import PolicyEngine

    threads = intra_op_threads(run.config.optim)
    server = PolicyServerSettings(model=str(run.output), served_model_name=SERVED_NAME, threads=threads, max_tokens_cap=4096)
    model = copy if copied else run.model
    served = weights.LoadedModel(model=model, tokenizer=run.tokenizer, source="training", path=run.output, load_seconds=0.0)
    engine = PolicyEngine(served, server, settings.models_dir)
    executor = ExecutorSettings(temperature=rollout.temperature, top_p=rollout.top_p, max_tokens_per_turn=rollout.max_tokens_per_turn)
    planner = settings.planner.model_copy(update={"max_tokens": max(16, rollout.max_tokens_per_turn)})  # a plan is a turn too
    local = settings.model_copy(update={"policy_server": server, "executor": executor, "planner": planner, "metrics_port": 0})
    services = SERVICE_NAMES
    if store_addr:
        local = local.model_copy(update={"store_addr": store_addr})
        services = tuple(name for name in SERVICE_NAMES if name != "store")
    try:
        async with embedded(local, services, policy_engine=engine) as platform:
            yield Rollouts(run, remote=False, copied=copied, settings=platform.settings, engine=engine, copy=copy)
    finally:
        engine.close()


async def solve(stub: executor_pb2_grpc.ExecutorStub, request: executor_pb2.SolveRequest, slots: asyncio.Semaphore) -> Trajectory:
    """Runs one episode; returns the stored trajectory from the final event."""
    async with slots:
        async for item in stub.Solve(request):
            if item.HasField("final"):
                return item.final.trajectory
    raise RuntimeError(f"the executor ended episode {request.trajectory_id} without a final event")
