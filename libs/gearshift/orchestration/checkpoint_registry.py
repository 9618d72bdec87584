"""The checkpoint registry, read and marked through the store over gRPC: what the task bodies,
publishing, the gate's evaluator and the loop ask of it. Below all of them, so none of them
imports another for it."""

from __future__ import annotations

from gearshift.api.common.v1.common_pb2 import Checkpoint, CheckpointStatus
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.settings import Settings


async def get_checkpoint(settings: Settings, checkpoint_id: str) -> Checkpoint:
    async with channel(settings.store_addr, settings) as ch:
        return await store_pb2_grpc.TrajectoryStoreStub(ch).GetCheckpoint(store_pb2.GetCheckpointRequest(id=checkpoint_id))


async def published(settings: Settings, kind: str = "policy") -> Checkpoint | None:
    """The newest published checkpoint of a kind."""
    async with channel(settings.store_addr, settings) as ch:
        reply = await store_pb2_grpc.TrajectoryStoreStub(ch).ListCheckpoints(
            store_pb2.ListCheckpointsRequest(kind=kind, status=CheckpointStatus.CHECKPOINT_STATUS_PUBLISHED, limit=1)
        )
    return reply.checkpoints[0] if reply.checkpoints else None


async def update_checkpoint(settings: Settings, checkpoint_id: str, status: int, metrics: dict[str, float]) -> Checkpoint:
    finite = {name: value for name, value in metrics.items() if isinstance(value, (int, float))}
    async with channel(settings.store_addr, settings) as ch:
        return await store_pb2_grpc.TrajectoryStoreStub(ch).UpdateCheckpoint(
            store_pb2.UpdateCheckpointRequest(id=checkpoint_id, status=status, eval_metrics=finite)
        )
