"""Training data from the trajectory store: a TrajectoryFilter built from the job's config,
streamed through Export, and a dataset snapshot id that names exactly what was read."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from gearshift.api.common.v1.common_pb2 import Purpose, Trajectory, TrajectoryStatus
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.protocol.modes import MODE_OF
from gearshift.settings import Settings
from gearshift.training.config import DataConfig

PURPOSES = {
    "serving": Purpose.PURPOSE_UNSPECIFIED,
    "evaluation": Purpose.PURPOSE_EVALUATION,
    "gate": Purpose.PURPOSE_GATE,
    "training": Purpose.PURPOSE_TRAINING,
}
CORRECTNESS = {
    "any": store_pb2.CORRECTNESS_UNSPECIFIED,
    "correct": store_pb2.CORRECTNESS_CORRECT,
    "incorrect": store_pb2.CORRECTNESS_INCORRECT,
    "unscored": store_pb2.CORRECTNESS_UNSCORED,
}


def trajectory_filters(config: DataConfig) -> list[store_pb2.TrajectoryFilter]:
    """The store filters for a data config: one per run id (the filter takes a single one)."""
    base = store_pb2.TrajectoryFilter(
        modes=[MODE_OF[mode] for mode in config.modes],
        correctness=CORRECTNESS[config.correctness],
        task_source=config.task_source,
        split=config.split,
        model_version=config.model_version,
        statuses=[TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED] if config.completed_only else [],
        purposes=[PURPOSES[purpose] for purpose in config.purposes],
        feedback_only=config.feedback_only,
    )
    if config.min_reward is not None:
        base.min_reward = config.min_reward
    if config.max_reward is not None:
        base.max_reward = config.max_reward
    if not config.run_ids:
        return [base]
    filters = []
    for run_id in config.run_ids:
        one = store_pb2.TrajectoryFilter()
        one.CopyFrom(base)
        one.run_id = run_id
        filters.append(one)
    return filters


async def export(store_addr: str, config: DataConfig, settings: Settings | None = None) -> list[Trajectory]:
    """Every matching trajectory with its turns, oldest first, each id once."""
    settings = settings or Settings()
    found: dict[str, Trajectory] = {}
    async with channel(store_addr, settings) as ch:
        stub = store_pb2_grpc.TrajectoryStoreStub(ch)
        for query in trajectory_filters(config):
            request = store_pb2.ExportRequest(filter=query, include_turns=True, limit=config.limit)
            async for trajectory in stub.Export(request):
                found.setdefault(trajectory.id, trajectory)
    return list(found.values())


def load_trajectories(store_addr: str, config: DataConfig, settings: Settings | None = None) -> list[Trajectory]:
    """export() for synchronous callers (the trainers). Called inside a running event loop (APO's
    and distillation's trainers are async and read their prompts first), it reads on a thread
    of its own, as asyncio.run refuses to nest."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(export(store_addr, config, settings))
    with ThreadPoolExecutor(max_workers=1) as reader:
        return reader.submit(asyncio.run, export(store_addr, config, settings)).result()


def snapshot_id(trajectory_ids: Iterable[str]) -> str:
    """Names a dataset by its content: the hash of its sorted trajectory ids."""
    digest = hashlib.sha256("\n".join(sorted(set(trajectory_ids))).encode()).hexdigest()
    return f"ds-{digest[:16]}"
