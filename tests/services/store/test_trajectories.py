"""Put, Get, Query, Export and SetReward over real gRPC, on SQLite and on Postgres."""

from __future__ import annotations

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import Mode, Reward, TrajectoryStatus
from gearshift.api.store.v1 import store_pb2
from google.protobuf.timestamp_pb2 import Timestamp

from tests.libs.storage.helpers import BASE_US, make_trajectory

UNKNOWN_ID = "00000000-0000-0000-0000-000000000000"


def at(offset_us: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromMicroseconds(BASE_US + offset_us)
    return stamp


async def query_all(stub, flt: store_pb2.TrajectoryFilter, page_size: int = 3, include_turns: bool = False):
    """Every page of a query, with the number of pages."""
    found, token, pages = [], "", 0
    while True:
        reply = await stub.Query(
            store_pb2.QueryRequest(filter=flt, page_size=page_size, page_token=token, include_turns=include_turns)
        )
        found += reply.trajectories
        pages += 1
        token = reply.next_page_token
        if not token:
            return found, pages


async def test_put_is_idempotent_on_id(stub, stored_rows):
    first, second = make_trajectory(), make_trajectory()
    reply = await stub.Put(store_pb2.PutRequest(trajectories=[first, second]))
    assert (reply.inserted, reply.duplicates) == (2, 0)
    third = make_trajectory()
    reply = await stub.Put(store_pb2.PutRequest(trajectories=[first, third, third]))
    assert (reply.inserted, reply.duplicates) == (1, 2)
    assert stored_rows()["trajectories"] == 3

    changed = make_trajectory(id=first.id, query="something else")
    await stub.Put(store_pb2.PutRequest(trajectories=[changed]))
    assert (await stub.Get(store_pb2.GetRequest(id=first.id))).trajectory == first  # the first write stays


async def test_get_returns_the_whole_trajectory(stub):
    trajectory = make_trajectory(turns=3, reward=Reward(value=1.0, correct=True, components={"r_acc": 1.0}))
    trajectory.labels["domain"] = "math"
    await stub.Put(store_pb2.PutRequest(trajectories=[trajectory]))
    stored = (await stub.Get(store_pb2.GetRequest(id=trajectory.id))).trajectory
    assert stored == trajectory
    assert stored.turns[2].tool_results[0].output == "391\n"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Get(store_pb2.GetRequest(id=UNKNOWN_ID))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_put_stamps_missing_created_at_and_keeps_microseconds(stub):
    unstamped = make_trajectory(created_us=None)
    precise = make_trajectory()
    precise.created_at.nanos = 123_456_789
    await stub.Put(store_pb2.PutRequest(trajectories=[unstamped, precise]))
    stored = (await stub.Get(store_pb2.GetRequest(id=unstamped.id))).trajectory
    assert stored.created_at.seconds > 1_700_000_000
    assert (await stub.Get(store_pb2.GetRequest(id=precise.id))).trajectory.created_at.nanos == 123_456_000


async def test_every_filter_selects_exactly_its_matches(stub):
    rows = [
        make_trajectory(created_us=BASE_US + 0, mode=Mode.MODE_INSTANT, reward=Reward(value=1.0, correct=True)),
        make_trajectory(created_us=BASE_US + 10, mode=Mode.MODE_REASONING, reward=Reward(value=0.2, correct=False)),
        make_trajectory(created_us=BASE_US + 20, mode=Mode.MODE_AGENTIC, reward=Reward(value=0.8, correct=True)),
        make_trajectory(created_us=BASE_US + 30, task_source="hotpot", split="dev", run_id="run-2"),
        make_trajectory(created_us=BASE_US + 40, model_version="sft-1", status=TrajectoryStatus.TRAJECTORY_STATUS_FAILED),
        make_trajectory(
            created_us=BASE_US + 50, status=TrajectoryStatus.TRAJECTORY_STATUS_BUDGET_EXHAUSTED,
            reward=Reward(value=0.0, correct=False),
        ),
    ]
    await stub.Put(store_pb2.PutRequest(trajectories=rows))
    ids = [t.id for t in rows]
    F = store_pb2.TrajectoryFilter
    cases = {
        "no filter": (F(), [0, 1, 2, 3, 4, 5]),
        "modes": (F(modes=[Mode.MODE_INSTANT, Mode.MODE_REASONING]), [0, 1]),
        "correct": (F(correctness=store_pb2.CORRECTNESS_CORRECT), [0, 2]),
        "incorrect": (F(correctness=store_pb2.CORRECTNESS_INCORRECT), [1, 5]),
        "unscored": (F(correctness=store_pb2.CORRECTNESS_UNSCORED), [3, 4]),
        "min_reward": (F(min_reward=0.8), [0, 2]),
        "max_reward": (F(max_reward=0.2), [1, 5]),
        "reward range": (F(min_reward=0.1, max_reward=0.9), [1, 2]),
        "task_source": (F(task_source="hotpot"), [3]),
        "split": (F(split="dev"), [3]),
        "run_id": (F(run_id="run-2"), [3]),
        "model_version": (F(model_version="sft-1"), [4]),
        "statuses": (
            F(statuses=[TrajectoryStatus.TRAJECTORY_STATUS_FAILED, TrajectoryStatus.TRAJECTORY_STATUS_BUDGET_EXHAUSTED]),
            [4, 5],
        ),
        "created_after (inclusive)": (F(created_after=at(20)), [2, 3, 4, 5]),
        "created_before (exclusive)": (F(created_before=at(20)), [0, 1]),
        "time window": (F(created_after=at(10), created_before=at(40)), [1, 2, 3]),
        "combined": (F(modes=[Mode.MODE_AGENTIC], correctness=store_pb2.CORRECTNESS_UNSCORED, split="train"), [4]),
        "nothing matches": (F(task_source="nowhere"), []),
    }
    for name, (flt, expected) in cases.items():
        found, _ = await query_all(stub, flt)
        newest_first = [ids[i] for i in sorted(expected, reverse=True)]
        assert [t.id for t in found] == newest_first, name


async def test_query_pages_through_everything_newest_first(stub):
    # Pairs share a created_at, so the id breaks ties across page boundaries.
    rows = [make_trajectory(created_us=BASE_US + i // 2) for i in range(23)]
    for start in range(0, len(rows), 10):
        await stub.Put(store_pb2.PutRequest(trajectories=rows[start : start + 10]))
    expected = sorted(rows, key=lambda t: (t.created_at.ToMicroseconds(), t.id), reverse=True)

    found, pages = await query_all(stub, store_pb2.TrajectoryFilter(), page_size=5)
    assert [t.id for t in found] == [t.id for t in expected]
    assert pages == 5
    assert all(len(t.turns) == 0 for t in found)  # turns only when asked for

    found, _ = await query_all(stub, store_pb2.TrajectoryFilter(), page_size=100, include_turns=True)
    assert found == expected


async def test_export_streams_everything_oldest_first(stub):
    rows = [make_trajectory(created_us=BASE_US + 1_000 - i, run_id="run-x" if i % 2 else "run-y") for i in range(11)]
    await stub.Put(store_pb2.PutRequest(trajectories=rows))
    oldest_first = sorted(rows, key=lambda t: t.created_at.ToMicroseconds())

    exported = [t async for t in stub.Export(store_pb2.ExportRequest(include_turns=True))]
    assert exported == oldest_first  # 11 rows read in chunks of 4, turns included

    limited = [t async for t in stub.Export(store_pb2.ExportRequest(limit=5))]
    assert [t.id for t in limited] == [t.id for t in oldest_first[:5]]
    assert all(not t.turns for t in limited)

    filtered = [t async for t in stub.Export(store_pb2.ExportRequest(filter=store_pb2.TrajectoryFilter(run_id="run-x")))]
    assert [t.id for t in filtered] == [t.id for t in oldest_first if t.run_id == "run-x"]

    exact_chunks = [t async for t in stub.Export(store_pb2.ExportRequest(limit=8))]
    assert len(exact_chunks) == 8


async def test_set_reward_updates_reward_and_filters(stub):
    trajectory = make_trajectory()
    await stub.Put(store_pb2.PutRequest(trajectories=[trajectory]))

    async def matching(**flt) -> list[str]:
        reply = await stub.Query(store_pb2.QueryRequest(filter=store_pb2.TrajectoryFilter(**flt)))
        return [t.id for t in reply.trajectories]

    assert await matching(correctness=store_pb2.CORRECTNESS_UNSCORED) == [trajectory.id]
    assert await matching(min_reward=0.0) == []

    await stub.SetReward(store_pb2.SetRewardRequest(id=trajectory.id, reward=Reward(value=0.9, correct=True, kind="apo")))
    assert await matching(correctness=store_pb2.CORRECTNESS_UNSCORED) == []
    assert await matching(correctness=store_pb2.CORRECTNESS_CORRECT, min_reward=0.9) == [trajectory.id]

    await stub.SetReward(store_pb2.SetRewardRequest(id=trajectory.id, reward=Reward(value=0.1, correct=False)))
    assert await matching(correctness=store_pb2.CORRECTNESS_CORRECT) == []
    assert await matching(correctness=store_pb2.CORRECTNESS_INCORRECT, max_reward=0.1) == [trajectory.id]
    stored = (await stub.Get(store_pb2.GetRequest(id=trajectory.id))).trajectory
    assert stored.reward == Reward(value=0.1, correct=False)

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.SetReward(store_pb2.SetRewardRequest(id=UNKNOWN_ID, reward=Reward(value=1.0)))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
