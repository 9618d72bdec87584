"""On-policy rollouts for the jobs that learn from the model's own episodes (APO, distillation):
the model being trained, served by the embedded platform, runs episodes through the real
executor, router, planner and sandbox, exactly as serving runs them. Every model call of an
episode samples with the rollout settings (routing and planning explore too)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from gearshift import weights
from gearshift.api.common.v1.common_pb2 import Sampling, Trajectory
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.embedded import embedded
from gearshift.errors import FailedPrecondition
from gearshift.policy_client import PolicyClient
from gearshift.settings import ExecutorSettings, PolicyServerSettings, Settings
from gearshift.topology import SERVICE_NAMES
from gearshift.training import checkpoints, tokenization
from gearshift.training.config import RolloutConfig
from gearshift.training.runtime import Run

SERVED_NAME = "policy-in-training"


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


@contextlib.asynccontextmanager
async def rollout_services(run: Run, rollout: RolloutConfig, store_addr: str, threads: int) -> AsyncIterator[tuple[Settings, bool]]:
    """Settings pointing at an executor and reward service; True when weights must be reloaded
    into a remote policy server after each update (reload_remote).

    By default the services run in this process and the built-in policy server serves the very
    module being trained: rollouts and updates alternate, so it always generates with the
    newest weights and no reload is needed. Rollouts are stored in the job's store when it has one."""
    settings = Settings()
    if rollout.executor_addr:
        remote = settings.model_copy(update={"executor_addr": rollout.executor_addr})
        yield (remote.with_policy(rollout.policy_url) if rollout.policy_url else remote), True
        return
    from gearshift.services.policy_server.core import PolicyEngine

    server = PolicyServerSettings(model=str(run.output), served_model_name=SERVED_NAME, threads=threads, max_tokens_cap=4096)
    served = weights.LoadedModel(model=run.model, tokenizer=run.tokenizer, source="training", path=run.output, load_seconds=0.0)
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
            yield platform.settings, False
    finally:
        engine.close()


async def reload_remote(run: Run, settings: Settings) -> float:
    """Saves the weights and makes the remote policy server load them; returns seconds taken."""
    started = time.perf_counter()
    serving = run.output / "serving"
    checkpoints.save_weights(run.policy, serving)
    async with PolicyClient.from_settings(settings) as policy:
        await policy.load(str(serving.resolve()))
    return time.perf_counter() - started


async def solve(stub: executor_pb2_grpc.ExecutorStub, request: executor_pb2.SolveRequest, slots: asyncio.Semaphore) -> Trajectory:
    """Runs one episode; returns the stored trajectory from the final event."""
    async with slots:
        async for item in stub.Solve(request):
            if item.HasField("final"):
                return item.final.trajectory
    raise RuntimeError(f"the executor ended episode {request.trajectory_id} without a final event")
