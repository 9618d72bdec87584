"""The executor's decoding reaches the policy: its frequency penalty on every turn's generation
(regulating and planning stay plain greedy), a rollout's sampling, penalties included, on every call."""

from __future__ import annotations

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import Mode, Sampling
from gearshift.settings import ExecutorSettings

from tests.services.executor.conftest import recording
from tests.services.executor.test_episode import solve


def with_penalty(settings, penalty: float):
    return settings.model_copy(update={"executor": ExecutorSettings(frequency_penalty=penalty)})


@pytest.fixture
async def penalised(settings, postgres_url):
    """(running settings with a frequency penalty of 0.5, the bodies of the policy requests in order)."""
    async with recording(with_penalty(settings, 0.5), postgres_url) as running:
        yield running


@pytest.fixture
async def plain(settings, postgres_url):
    """The same with no penalty (the executor's default is 0.5)."""
    async with recording(with_penalty(settings, 0.0), postgres_url) as running:
        yield running


def generations(bodies: list[dict]) -> list[dict]:
    """The requests that write the episode's turns, streamed (the rest regulate and plan)."""
    return [body for body in bodies if body.get("stream")]


async def test_every_turn_generates_with_the_executors_penalty_and_planning_does_not(penalised):
    stack, bodies = penalised
    events = await solve(stack, query="What is 17*23?", mode=Mode.MODE_AGENTIC)
    assert events[-1].final.trajectory.answer
    turns = generations(bodies)
    assert len(turns) >= 2 and all(body["frequency_penalty"] == 0.5 for body in turns)
    others = [body for body in bodies if body not in turns]
    assert others and all("frequency_penalty" not in body for body in others)


async def test_a_rollouts_penalties_reach_every_call_with_each_calls_own_seed(penalised):
    stack, bodies = penalised
    sampling = Sampling(temperature=1.0, top_p=1.0, seed=11, frequency_penalty=0.25, presence_penalty=0.125)
    await solve(stack, query="What is 17*23?", mode=Mode.MODE_AGENTIC, sampling=sampling)
    assert all(body["frequency_penalty"] == 0.25 and body["presence_penalty"] == 0.125 for body in bodies)
    seeds = [body["seed"] for body in bodies]
    assert seeds[0] >= 11 and seeds == list(range(seeds[0], seeds[0] + len(bodies)))


async def test_a_penalty_out_of_range_is_invalid_argument(penalised):
    stack, _ = penalised
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await solve(stack, query="What is 17*23?", sampling=Sampling(temperature=1.0, frequency_penalty=3.0))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "penalties" in raised.value.details()


async def test_without_a_penalty_no_request_carries_one(plain):
    stack, bodies = plain
    await solve(stack, query="What is 17*23?", mode=Mode.MODE_AGENTIC)
    assert bodies and not any("frequency_penalty" in body or "presence_penalty" in body for body in bodies)
