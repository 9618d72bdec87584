"""The episode's budget holds during a step (issue 60): it travels as the deadline of every call
the episode makes, and on through the services it calls to their policy requests. A stand-in
policy (named as such: scripted_model, which holds one kind of request until the test ends)
stalls one step; the episode ends BUDGET_EXHAUSTED at its budget with the turns it finished,
scored and stored, rather than waiting out the policy client's 120 s timeout and failing."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from gearshift.api.common.v1.common_pb2 import Mode, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2
from gearshift.embedded import embedded
from gearshift.testing.scripted_policy import serve_scripted

from tests.services.executor.test_episode import scripted_model, solve, stored

BUDGET_SECONDS = 3.0


class Stalling:
    """scripted_model, except that the requests `held` picks wait until the test ends."""

    def __init__(self, held):
        self.held = held
        self.holding = 0
        self.release = asyncio.Event()

    async def __call__(self, body: dict) -> str:
        if self.held(body):
            self.holding += 1
            await self.release.wait()
        return scripted_model(body)


def last_message(body: dict) -> str:
    messages = body.get("messages") or []
    return messages[-1]["content"] if messages else ""


def second_regulation(body: dict) -> bool:
    """The configurator's decision of turn 1, which the planner asks the policy for."""
    last = last_message(body)
    return last.endswith("Plan:") and "<tool_response>" in last


def second_generation(body: dict) -> bool:
    """The agent's generation of turn 1 (after the tool's result), which the executor streams."""
    return "<tool_response>" in last_message(body) and "<answer>391</answer>" in scripted_model(body)


@pytest.mark.parametrize(("held", "where"), [(second_regulation, "the planner's policy request"),
                                             (second_generation, "the executor's own policy stream")])
async def test_a_step_the_budget_runs_out_in_ends_the_episode_at_its_budget(settings, held, where):
    policy = Stalling(held)
    async with serve_scripted(policy) as policy_url:
        async with embedded(settings.with_policy(policy_url)) as platform:
            trajectory_id = str(uuid.uuid4())
            started = time.monotonic()
            events = await asyncio.wait_for(solve(
                platform.settings, query="What is 17*23?", mode=Mode.MODE_AGENTIC, reference_answer="391", trajectory_id=trajectory_id,
                budget=executor_pb2.Budget(max_wall_seconds=BUDGET_SECONDS),
            ), 30)  # before: the stall lasted until the policy client's timeout (120 s), and the episode FAILED
            took = time.monotonic() - started
            kept = await stored(platform.settings, trajectory_id)
            policy.release.set()
    print(f"\nbudget {BUDGET_SECONDS:g} s, {where} stalled: the episode ended after {took:.2f} s")
    assert policy.holding == 1
    final = events[-1].final.trajectory
    assert final.status == TrajectoryStatus.TRAJECTORY_STATUS_BUDGET_EXHAUSTED
    assert BUDGET_SECONDS - 0.1 <= took < BUDGET_SECONDS + 5  # the wrap-up (score, store) after it
    assert [turn.index for turn in final.turns] == [0] and final.turns[0].tool_results  # the turn it finished
    assert final.reward.kind  # scored, as an episode that ran out between steps is
    assert kept == final
