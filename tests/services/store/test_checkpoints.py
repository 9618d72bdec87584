"""The checkpoint registry and its lineage over real gRPC, on SQLite and on Postgres."""

from __future__ import annotations

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import Checkpoint, CheckpointStatus
from gearshift.api.store.v1 import store_pb2

from tests.libs.storage.helpers import make_trajectory

CANDIDATE = CheckpointStatus.CHECKPOINT_STATUS_CANDIDATE
PUBLISHED = CheckpointStatus.CHECKPOINT_STATUS_PUBLISHED
REJECTED = CheckpointStatus.CHECKPOINT_STATUS_REJECTED


async def register(stub, **fields) -> Checkpoint:
    return await stub.RegisterCheckpoint(store_pb2.RegisterCheckpointRequest(checkpoint=Checkpoint(**fields)))


async def test_checkpoint_lineage_round_trips(stub):
    data = [make_trajectory() for _ in range(3)]
    await stub.Put(store_pb2.PutRequest(trajectories=data))
    base = await register(stub, id="smollm2-base", kind="policy", uri="/models/smollm2")
    assert base.status == CANDIDATE and base.created_at.seconds > 0

    lineage = sorted(t.id for t in data)
    child = await register(
        stub,
        id="sft-20261129-ab12",
        kind="policy",
        uri="/ckpt/sft-1",
        parent_id="smollm2-base",
        job="sft",
        config_json='{"lr": 1e-05, "epochs": 2}',
        code_version="3d47650",
        dataset_snapshot="export-2026-11-29",
        trajectory_ids=[lineage[2], lineage[0], lineage[1], lineage[0]],  # a repeat is stored once
        eval_metrics={"accuracy": 0.5},
    )
    assert child.parent_id == "smollm2-base"

    stored = await stub.GetCheckpoint(store_pb2.GetCheckpointRequest(id=child.id, include_lineage=True))
    assert list(stored.trajectory_ids) == lineage
    assert (stored.job, stored.config_json, stored.code_version, stored.dataset_snapshot) == (
        "sft", '{"lr": 1e-05, "epochs": 2}', "3d47650", "export-2026-11-29",
    )
    assert dict(stored.eval_metrics) == {"accuracy": 0.5}
    bare = await stub.GetCheckpoint(store_pb2.GetCheckpointRequest(id=child.id))
    assert list(bare.trajectory_ids) == []


async def test_update_merges_metrics_and_list_filters(stub):
    await register(stub, id="a", kind="policy", uri="/a", eval_metrics={"accuracy": 0.4, "cost_of_pass": 0.01})
    await register(stub, id="b", kind="router", uri="/b")
    await register(stub, id="c", kind="policy", uri="/c", parent_id="a")

    updated = await stub.UpdateCheckpoint(
        store_pb2.UpdateCheckpointRequest(id="a", status=PUBLISHED, eval_metrics={"accuracy": 0.6, "latency_s": 1.5})
    )
    assert updated.status == PUBLISHED
    assert dict(updated.eval_metrics) == {"accuracy": 0.6, "cost_of_pass": 0.01, "latency_s": 1.5}
    kept = await stub.UpdateCheckpoint(store_pb2.UpdateCheckpointRequest(id="a"))  # UNSPECIFIED leaves the status
    assert kept.status == PUBLISHED

    async def listed(**request) -> list[str]:
        reply = await stub.ListCheckpoints(store_pb2.ListCheckpointsRequest(**request))
        return [c.id for c in reply.checkpoints]

    assert await listed() == ["c", "b", "a"]  # newest first
    assert await listed(kind="policy") == ["c", "a"]
    assert await listed(status=PUBLISHED) == ["a"]
    assert await listed(status=REJECTED) == []
    assert await listed(limit=1) == ["c"]


async def test_registry_refusals_write_nothing(stub, stored_rows):
    trajectory = make_trajectory()
    await stub.Put(store_pb2.PutRequest(trajectories=[trajectory]))
    await register(stub, id="a", kind="policy", uri="/a")

    async def refused(code: grpc.StatusCode, call) -> str:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == code, err.value.details()
        return err.value.details()

    assert "already exists" in await refused(grpc.StatusCode.ALREADY_EXISTS, register(stub, id="a", kind="router", uri="/z"))
    assert "parent" in await refused(grpc.StatusCode.NOT_FOUND, register(stub, id="b", kind="policy", uri="/b", parent_id="nope"))
    missing = "00000000-0000-0000-0000-000000000000"
    details = await refused(
        grpc.StatusCode.NOT_FOUND,
        register(stub, id="b", kind="policy", uri="/b", trajectory_ids=[trajectory.id, missing]),
    )
    assert missing in details
    await refused(grpc.StatusCode.NOT_FOUND, stub.GetCheckpoint(store_pb2.GetCheckpointRequest(id="b")))
    await refused(grpc.StatusCode.NOT_FOUND, stub.UpdateCheckpoint(store_pb2.UpdateCheckpointRequest(id="b", status=PUBLISHED)))

    invalid = grpc.StatusCode.INVALID_ARGUMENT
    bad_registrations = {
        "empty id": dict(id="", kind="policy", uri="/x"),
        "unknown kind": dict(id="x", kind="tokenizer", uri="/x"),
        "empty uri": dict(id="x", kind="policy", uri=" "),
        "own parent": dict(id="x", kind="policy", uri="/x", parent_id="x"),
        "config not JSON": dict(id="x", kind="policy", uri="/x", config_json="{lr: 1"),
        "unknown status": dict(id="x", kind="policy", uri="/x", status=9),
        "infinite metric": dict(id="x", kind="policy", uri="/x", eval_metrics={"accuracy": float("inf")}),
        "lineage id not a UUID": dict(id="x", kind="policy", uri="/x", trajectory_ids=["t1"]),
        "id too long": dict(id="x" * 300, kind="policy", uri="/x"),
    }
    for name, fields in bad_registrations.items():
        assert await refused(invalid, register(stub, **fields)), name
    await refused(invalid, stub.RegisterCheckpoint(store_pb2.RegisterCheckpointRequest()))
    await refused(invalid, stub.UpdateCheckpoint(store_pb2.UpdateCheckpointRequest(id="a", status=7)))
    await refused(invalid, stub.UpdateCheckpoint(store_pb2.UpdateCheckpointRequest(id="a", eval_metrics={"x": float("nan")})))
    await refused(invalid, stub.ListCheckpoints(store_pb2.ListCheckpointsRequest(status=5)))
    await refused(invalid, stub.ListCheckpoints(store_pb2.ListCheckpointsRequest(limit=-1)))

    assert stored_rows() == {"trajectories": 1, "checkpoints": 1}
    unchanged = await stub.GetCheckpoint(store_pb2.GetCheckpointRequest(id="a", include_lineage=True))
    assert (unchanged.status, dict(unchanged.eval_metrics), list(unchanged.trajectory_ids)) == (CANDIDATE, {}, [])
