"""RegisterCheckpoint retried by a training job, over real gRPC, on SQLite and on Postgres."""

from __future__ import annotations

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import Checkpoint, CheckpointStatus
from gearshift.api.store.v1 import store_pb2

from tests.libs.storage.helpers import make_trajectory

PUBLISHED = CheckpointStatus.CHECKPOINT_STATUS_PUBLISHED


async def test_a_retry_is_ok_and_other_content_is_already_exists(stub, stored_rows):
    data = [make_trajectory() for _ in range(2)]
    await stub.Put(store_pb2.PutRequest(trajectories=data))
    checkpoint = Checkpoint(
        id="sft-1",
        kind="policy",
        uri="/ckpt/sft-1",
        job="sft",
        trajectory_ids=[t.id for t in data],
        eval_metrics={"train_loss": 0.25},
    )
    request = store_pb2.RegisterCheckpointRequest(checkpoint=checkpoint)
    first = await stub.RegisterCheckpoint(request)
    await stub.UpdateCheckpoint(store_pb2.UpdateCheckpointRequest(id="sft-1", status=PUBLISHED, eval_metrics={"accuracy": 0.6}))

    retried = await stub.RegisterCheckpoint(request)
    assert retried.created_at == first.created_at
    assert (retried.status, dict(retried.eval_metrics)) == (PUBLISHED, {"train_loss": 0.25, "accuracy": 0.6})

    checkpoint.uri = "/ckpt/elsewhere"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.RegisterCheckpoint(store_pb2.RegisterCheckpointRequest(checkpoint=checkpoint))
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert err.value.details() == "checkpoint sft-1 already exists with a different uri"
    assert stored_rows() == {"trajectories": 2, "checkpoints": 1}
