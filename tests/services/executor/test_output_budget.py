"""Budget.max_output_tokens (what OpenAI's max_completion_tokens means): every generation is
capped at what is left of it, and the episode ends BUDGET_EXHAUSTED once it is spent."""

from __future__ import annotations

import pytest
from gearshift.api.common.v1.common_pb2 import Mode, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2

from tests.services.executor.test_episode import solve


async def test_generations_stay_within_the_output_budget(recorded):
    stack, bodies = recorded
    unbounded = (await solve(stack, query="What is 17*23?", mode=Mode.MODE_AGENTIC))[-1].final.trajectory
    assert unbounded.status == TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED
    spent = unbounded.usage.output_tokens
    bodies.clear()
    first_turn = unbounded.turns[0].usage.output_tokens
    # Enough for the first turn, not for the answer after the tool call. (The stand-in does not
    # stop at max_tokens as an engine does, so the cut shows in what it was asked for.)
    budget = executor_pb2.Budget(max_output_tokens=first_turn)
    bounded = (await solve(stack, query="What is 17*23?", mode=Mode.MODE_AGENTIC, budget=budget))[-1].final.trajectory
    assert bounded.status == TrajectoryStatus.TRAJECTORY_STATUS_BUDGET_EXHAUSTED and not bounded.answer
    assert bounded.usage.output_tokens == first_turn < spent
    generations = [body for body in bodies if body.get("continue_final_message") and "</tool_call>" in body.get("stop", [])]
    assert generations and all(body["max_tokens"] <= first_turn for body in generations)


async def test_a_negative_output_budget_is_invalid(recorded):
    stack, _ = recorded
    with pytest.raises(Exception, match="must not be negative"):
        await solve(stack, query="What is 17*23?", budget=executor_pb2.Budget(max_output_tokens=-1))
