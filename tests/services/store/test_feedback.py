"""Feedback over real gRPC, on SQLite and on Postgres: SetReward says what it replaced (and two
verdicts racing lose neither), and feedback_only selects exactly the trajectories whose reward
is a client's verdict, in Query (paged) and in Export."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import Reward
from gearshift.api.store.v1 import store_pb2
from gearshift.rewards.feedback import feedback_verifier

from tests.libs.storage.helpers import BASE_US, make_trajectory
from tests.libs.storage.test_feedback import assert_a_chain
from tests.services.store.test_trajectories import query_all

CORRECT = Reward(value=1.0, correct=True, kind="feedback", verifier=feedback_verifier())
INCORRECT = Reward(value=0.0, correct=False, kind="feedback", verifier=feedback_verifier("exact"))


async def test_set_reward_says_whether_it_replaced_and_what(stub):
    trajectory = make_trajectory()
    await stub.Put(store_pb2.PutRequest(trajectories=[trajectory]))

    first = await stub.SetReward(store_pb2.SetRewardRequest(id=trajectory.id, reward=CORRECT))
    assert not first.replaced and not first.HasField("previous")
    second = await stub.SetReward(store_pb2.SetRewardRequest(id=trajectory.id, reward=INCORRECT))
    assert second.replaced and second.previous == CORRECT
    assert (await stub.Get(store_pb2.GetRequest(id=trajectory.id))).trajectory.reward == INCORRECT

    put_scored = make_trajectory(reward=Reward(value=0.5, kind="apo"))
    await stub.Put(store_pb2.PutRequest(trajectories=[put_scored]))
    reply = await stub.SetReward(store_pb2.SetRewardRequest(id=put_scored.id, reward=CORRECT))
    assert reply.replaced and reply.previous == Reward(value=0.5, kind="apo")  # a reward put with the trajectory counts too


async def test_verdicts_racing_over_grpc_lose_none(stub):
    trajectory = make_trajectory()
    await stub.Put(store_pb2.PutRequest(trajectories=[trajectory]))
    verdicts = [Reward(value=i / 12, correct=i % 2 == 0, verifier=feedback_verifier()) for i in range(12)]
    replies = await asyncio.gather(*(stub.SetReward(store_pb2.SetRewardRequest(id=trajectory.id, reward=r)) for r in verdicts))
    stored = (await stub.Get(store_pb2.GetRequest(id=trajectory.id))).trajectory.reward
    assert_a_chain(verdicts, [r.previous if r.replaced else None for r in replies], stored)


async def test_feedback_only_selects_the_clients_verdicts_in_query_and_export(stub):
    rows = [make_trajectory(created_us=BASE_US + i) for i in range(9)]
    rows[0].reward.CopyFrom(CORRECT)  # put with its verdict
    rows[8].reward.CopyFrom(Reward(value=1.0, correct=True, kind="apo", verifier="phrase"))  # scored, no feedback
    await stub.Put(store_pb2.PutRequest(trajectories=rows))
    for i in (2, 3, 5, 7):
        await stub.SetReward(store_pb2.SetRewardRequest(id=rows[i].id, reward=INCORRECT if i == 5 else CORRECT))
    await stub.SetReward(store_pb2.SetRewardRequest(id=rows[7].id, reward=Reward(value=0.3, kind="apo")))  # re-scored
    feedback = [rows[i].id for i in (0, 2, 3, 5)]

    F = store_pb2.TrajectoryFilter
    found, pages = await query_all(stub, F(feedback_only=True), page_size=3)
    assert [t.id for t in found] == feedback[::-1] and pages == 2
    found, _ = await query_all(stub, F(feedback_only=True, correctness=store_pb2.CORRECTNESS_CORRECT))
    assert [t.id for t in found] == [rows[i].id for i in (3, 2, 0)]
    assert [t.id for t in (await query_all(stub, F()))[0]] == [t.id for t in rows[::-1]]  # unset: every row

    exported = [t async for t in stub.Export(store_pb2.ExportRequest(filter=F(feedback_only=True), include_turns=True))]
    assert [t.id for t in exported] == feedback and all(t.turns for t in exported)  # chunks of 4: two chunks
    assert [t.reward for t in exported] == [CORRECT, CORRECT, CORRECT, INCORRECT]
    limited = [t.id async for t in stub.Export(store_pb2.ExportRequest(filter=F(feedback_only=True), limit=3))]
    assert limited == feedback[:3]
    incorrect = F(feedback_only=True, correctness=store_pb2.CORRECTNESS_INCORRECT)
    assert [t.id async for t in stub.Export(store_pb2.ExportRequest(filter=incorrect))] == [rows[5].id]


async def test_feedback_only_refusals(stub):
    for trajectory in [make_trajectory(created_us=BASE_US + i, reward=CORRECT) for i in range(3)]:
        await stub.Put(store_pb2.PutRequest(trajectories=[trajectory]))
    F = store_pb2.TrajectoryFilter
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Query(store_pb2.QueryRequest(filter=F(feedback_only=True, correctness=store_pb2.CORRECTNESS_UNSCORED)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "feedback_only" in err.value.details()
    page = await stub.Query(store_pb2.QueryRequest(filter=F(feedback_only=True), page_size=1))
    with pytest.raises(grpc.aio.AioRpcError) as err:  # a token names its filter, feedback_only included
        await stub.Query(store_pb2.QueryRequest(filter=F(), page_size=1, page_token=page.next_page_token))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "different filter" in err.value.details()
