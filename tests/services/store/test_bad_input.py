"""Bad input gets INVALID_ARGUMENT (or UNAUTHENTICATED) and nothing is written."""

from __future__ import annotations

import math

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import Reward, Trajectory, TrajectoryStatus
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.server import running
from gearshift.services.store.service import FULL_NAME, build
from gearshift.settings import Limits
from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import SecretStr

from tests.libs.storage.helpers import BASE_US, make_trajectory

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def broken(**changes) -> Trajectory:
    trajectory = make_trajectory()
    for field, value in changes.items():
        setattr(trajectory, field, value)
    return trajectory


def with_bad_turn() -> Trajectory:
    trajectory = make_trajectory()
    trajectory.turns[1].plan_decision = 17
    return trajectory


def with_bad_timestamp() -> Trajectory:
    trajectory = make_trajectory()
    trajectory.created_at.nanos = -1
    return trajectory


BAD_TRAJECTORIES = {
    "empty id": (lambda: broken(id=""), "id is empty"),
    "id not a UUID": (lambda: broken(id="trajectory-1"), "not a UUID"),
    "empty query": (lambda: broken(query=""), "query is empty"),
    "blank query": (lambda: broken(query=" \n"), "query is empty"),
    "oversized query": (lambda: broken(query="q" * 101), "query longer"),
    "oversized answer": (lambda: broken(answer="a" * 201), "answer longer"),
    "oversized reference": (lambda: broken(reference_answer="a" * 201), "reference_answer longer"),
    "too many turns": (lambda: make_trajectory(turns=4), "more than 3 turns"),
    "UNSPECIFIED status": (lambda: broken(status=TrajectoryStatus.TRAJECTORY_STATUS_UNSPECIFIED), "UNSPECIFIED"),
    "unknown status": (lambda: broken(status=42), "status has unknown value 42"),
    "unknown mode": (lambda: broken(mode=9), "mode has unknown value 9"),
    "unknown requested mode": (lambda: broken(requested_mode=-1), "requested_mode"),
    "unknown routing strategy": (lambda: broken(routing_strategy=8), "routing_strategy"),
    "unknown plan decision": (with_bad_turn, "plan_decision"),
    "NaN reward": (lambda: make_trajectory(reward=Reward(value=math.nan)), "reward.value"),
    "NUL in a label": (lambda: broken(task_source="gsm\x00"), "NUL"),
    "oversized label": (lambda: broken(run_id="r" * 257), "run_id longer"),
    "invalid timestamp": (with_bad_timestamp, "created_at"),
}


@pytest.fixture
def store_settings(store_settings):
    """Small limits, so oversized input is cheap to build."""
    limits = Limits(max_query_chars=100, max_answer_chars=200, max_turns=3, max_batch=5)
    return store_settings.model_copy(update={"limits": limits})


async def expect(code: grpc.StatusCode, call) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == code, err.value.details()
    return err.value.details()


@pytest.mark.parametrize("case", sorted(BAD_TRAJECTORIES))
async def test_one_bad_trajectory_rejects_the_whole_batch(stub, stored_rows, case):
    make_bad, reason = BAD_TRAJECTORIES[case]
    batch = [make_trajectory(), make_bad(), make_trajectory()]
    details = await expect(INVALID, stub.Put(store_pb2.PutRequest(trajectories=batch)))
    assert reason in details and "trajectories[1]" in details
    assert stored_rows()["trajectories"] == 0


async def test_oversized_batch_and_undecodable_bytes_write_nothing(stub, store_address, stored_rows):
    batch = [make_trajectory() for _ in range(6)]
    assert "larger than 5" in await expect(INVALID, stub.Put(store_pb2.PutRequest(trajectories=batch)))

    good = store_pb2.PutRequest(trajectories=[make_trajectory()]).SerializeToString()
    async with grpc.aio.insecure_channel(store_address) as ch:
        raw = ch.unary_unary(f"/{FULL_NAME}/Put", request_serializer=None, response_deserializer=None)
        assert "does not parse" in await expect(INVALID, raw(good[:-7]))  # cut off mid-message
        assert "does not parse" in await expect(INVALID, raw(b"\xff\xff\xff\xff"))
        # A query that is not UTF-8: field 1 (trajectories) holding field 2 (query) = b"\xff\xfe".
        assert "does not parse" in await expect(INVALID, raw(b"\x0a\x04\x12\x02\xff\xfe"))
        assert (await raw(good)) is not None
    assert stored_rows()["trajectories"] == 1


def stamp(offset_us: int) -> Timestamp:
    value = Timestamp()
    value.FromMicroseconds(BASE_US + offset_us)
    return value


BAD_FILTERS = {
    "min_reward > max_reward": store_pb2.TrajectoryFilter(min_reward=0.9, max_reward=0.1),
    "empty time window": store_pb2.TrajectoryFilter(created_after=stamp(5), created_before=stamp(5)),
    "reversed time window": store_pb2.TrajectoryFilter(created_after=stamp(9), created_before=stamp(5)),
    "reward range on unscored": store_pb2.TrajectoryFilter(min_reward=0.5, correctness=store_pb2.CORRECTNESS_UNSCORED),
    "unknown mode": store_pb2.TrajectoryFilter(modes=[1, 12]),
    "UNSPECIFIED status": store_pb2.TrajectoryFilter(statuses=[TrajectoryStatus.TRAJECTORY_STATUS_UNSPECIFIED]),
    "unknown correctness": store_pb2.TrajectoryFilter(correctness=9),
    "NaN reward bound": store_pb2.TrajectoryFilter(max_reward=math.nan),
    "oversized label": store_pb2.TrajectoryFilter(task_source="t" * 300),
}


async def test_impossible_or_unknown_filters_are_refused(stub):
    for name, flt in BAD_FILTERS.items():
        details = await expect(INVALID, stub.Query(store_pb2.QueryRequest(filter=flt)))
        assert details, name
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [t async for t in stub.Export(store_pb2.ExportRequest(filter=flt))]
        assert err.value.code() == INVALID, name
    await expect(INVALID, stub.Query(store_pb2.QueryRequest(page_size=-1)))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        [t async for t in stub.Export(store_pb2.ExportRequest(limit=-1))]
    assert err.value.code() == INVALID


async def test_bad_page_tokens_are_refused(stub):
    await stub.Put(store_pb2.PutRequest(trajectories=[make_trajectory(created_us=BASE_US + i) for i in range(3)]))
    first = await stub.Query(store_pb2.QueryRequest(page_size=1))
    assert first.next_page_token
    for token in ("not a token", "eyJ4IjogMX0", "W10", first.next_page_token[:-3], "A" * 2_000):
        assert "page_token" in await expect(INVALID, stub.Query(store_pb2.QueryRequest(page_token=token)))
    other_filter = store_pb2.QueryRequest(filter=store_pb2.TrajectoryFilter(split="dev"), page_token=first.next_page_token)
    assert "different filter" in await expect(INVALID, stub.Query(other_filter))


async def test_bad_ids_and_rewards_are_refused(stub, stored_rows):
    trajectory = make_trajectory()
    await stub.Put(store_pb2.PutRequest(trajectories=[trajectory]))
    assert "empty" in await expect(INVALID, stub.Get(store_pb2.GetRequest(id="")))
    await expect(INVALID, stub.Get(store_pb2.GetRequest(id="'; DROP TABLE trajectories; --")))
    await expect(INVALID, stub.SetReward(store_pb2.SetRewardRequest(id=trajectory.id)))
    await expect(INVALID, stub.SetReward(store_pb2.SetRewardRequest(id=trajectory.id, reward=Reward(value=math.inf))))
    bad_component = Reward(value=1.0, components={"r_acc": math.nan})
    await expect(INVALID, stub.SetReward(store_pb2.SetRewardRequest(id=trajectory.id, reward=bad_component)))
    assert not (await stub.Get(store_pb2.GetRequest(id=trajectory.id))).trajectory.HasField("reward")
    assert stored_rows()["trajectories"] == 1


async def test_token_is_required_when_configured(store_settings, stored_rows):
    secured = store_settings.model_copy(update={"auth_token": SecretStr("s3cret")})
    request = store_pb2.PutRequest(trajectories=[make_trajectory()])
    async with running(await build(secured), secured) as server:
        address = f"127.0.0.1:{server.port}"
        async with channel(address, store_settings) as anonymous:
            await expect(grpc.StatusCode.UNAUTHENTICATED, store_pb2_grpc.TrajectoryStoreStub(anonymous).Put(request))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                [t async for t in store_pb2_grpc.TrajectoryStoreStub(anonymous).Export(store_pb2.ExportRequest())]
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert stored_rows()["trajectories"] == 0
        async with channel(address, secured) as trusted:
            reply = await store_pb2_grpc.TrajectoryStoreStub(trusted).Put(request)
    assert reply.inserted == 1 and stored_rows()["trajectories"] == 1
