"""Router artefacts in the store's checkpoint registry (kind "router")."""

from __future__ import annotations

from gearshift.api.common.v1.common_pb2 import Checkpoint, CheckpointStatus
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.errors import FailedPrecondition

ROUTER_KIND = "router"
PUBLISHED = CheckpointStatus.CHECKPOINT_STATUS_PUBLISHED


async def newest_published(stub: store_pb2_grpc.TrajectoryStoreStub) -> Checkpoint | None:
    """The most recently registered PUBLISHED router, or None."""
    reply = await stub.ListCheckpoints(store_pb2.ListCheckpointsRequest(kind=ROUTER_KIND, status=PUBLISHED, limit=1))
    return reply.checkpoints[0] if reply.checkpoints else None


async def publish(stub: store_pb2_grpc.TrajectoryStoreStub, version: str) -> Checkpoint:
    """Marks a router checkpoint PUBLISHED; router services pick it up on their next poll."""
    checkpoint = await stub.GetCheckpoint(store_pb2.GetCheckpointRequest(id=version))
    if checkpoint.kind != ROUTER_KIND:
        raise FailedPrecondition(f"checkpoint {version} is a {checkpoint.kind} checkpoint, not a router")
    return await stub.UpdateCheckpoint(store_pb2.UpdateCheckpointRequest(id=version, status=PUBLISHED))


async def list_routers(stub: store_pb2_grpc.TrajectoryStoreStub, limit: int = 20) -> list[Checkpoint]:
    reply = await stub.ListCheckpoints(store_pb2.ListCheckpointsRequest(kind=ROUTER_KIND, limit=limit))
    return list(reply.checkpoints)
