"""TrajectoryStore servicer: protobuf <-> TrajectoryStore, nothing else."""

from __future__ import annotations

from collections.abc import AsyncIterator

from gearshift.api.common.v1.common_pb2 import Checkpoint, Trajectory
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.errors import InvalidArgument
from gearshift.services.store.core import TrajectoryStore
from gearshift.services.store.validation import check_timestamp
from gearshift.storage.repository import Correctness, TrajectoryFilter

CORRECTNESS = {
    store_pb2.CORRECTNESS_UNSPECIFIED: Correctness.ANY,
    store_pb2.CORRECTNESS_CORRECT: Correctness.CORRECT,
    store_pb2.CORRECTNESS_INCORRECT: Correctness.INCORRECT,
    store_pb2.CORRECTNESS_UNSCORED: Correctness.UNSCORED,
}


def to_filter(message: store_pb2.TrajectoryFilter) -> TrajectoryFilter:
    if message.correctness not in CORRECTNESS:
        raise InvalidArgument(f"filter.correctness has unknown value {message.correctness}")
    times = {}
    for field in ("created_after", "created_before"):
        if message.HasField(field):
            check_timestamp(getattr(message, field), f"filter.{field}")
            times[f"{field}_us"] = getattr(message, field).ToMicroseconds()
    return TrajectoryFilter(
        modes=tuple(message.modes),
        statuses=tuple(message.statuses),
        purposes=tuple(message.purposes),
        correctness=CORRECTNESS[message.correctness],
        min_reward=message.min_reward if message.HasField("min_reward") else None,
        max_reward=message.max_reward if message.HasField("max_reward") else None,
        task_source=message.task_source,
        model_version=message.model_version,
        run_id=message.run_id,
        split=message.split,
        feedback_only=message.feedback_only,
        **times,
    )


class TrajectoryStoreServicer(store_pb2_grpc.TrajectoryStoreServicer):
    def __init__(self, store: TrajectoryStore):
        self.store = store

    async def Put(self, request: store_pb2.PutRequest, context) -> store_pb2.PutResponse:
        result = await self.store.put(list(request.trajectories))
        return store_pb2.PutResponse(inserted=result.inserted, duplicates=result.duplicates)

    async def Get(self, request: store_pb2.GetRequest, context) -> store_pb2.GetResponse:
        return store_pb2.GetResponse(trajectory=await self.store.get(request.id))

    async def Query(self, request: store_pb2.QueryRequest, context) -> store_pb2.QueryResponse:
        page = await self.store.query(
            to_filter(request.filter), request.page_size, request.page_token, request.include_turns
        )
        return store_pb2.QueryResponse(trajectories=page.trajectories, next_page_token=page.next_page_token)

    async def Export(self, request: store_pb2.ExportRequest, context) -> AsyncIterator[Trajectory]:
        async for trajectory in self.store.export(to_filter(request.filter), request.include_turns, request.limit):
            yield trajectory

    async def SetReward(self, request: store_pb2.SetRewardRequest, context) -> store_pb2.SetRewardResponse:
        if not request.HasField("reward"):
            raise InvalidArgument("reward is missing")
        previous = await self.store.set_reward(request.id, request.reward)
        return store_pb2.SetRewardResponse(replaced=previous is not None, previous=previous)

    async def RegisterCheckpoint(self, request: store_pb2.RegisterCheckpointRequest, context) -> Checkpoint:
        if not request.HasField("checkpoint"):
            raise InvalidArgument("checkpoint is missing")
        return await self.store.register_checkpoint(request.checkpoint)

    async def GetCheckpoint(self, request: store_pb2.GetCheckpointRequest, context) -> Checkpoint:
        return await self.store.get_checkpoint(request.id, request.include_lineage)

    async def ListCheckpoints(
        self, request: store_pb2.ListCheckpointsRequest, context
    ) -> store_pb2.ListCheckpointsResponse:
        checkpoints = await self.store.list_checkpoints(request.kind, request.status, request.limit)
        return store_pb2.ListCheckpointsResponse(checkpoints=checkpoints)

    async def UpdateCheckpoint(self, request: store_pb2.UpdateCheckpointRequest, context) -> Checkpoint:
        return await self.store.update_checkpoint(request.id, request.status, dict(request.eval_metrics))
