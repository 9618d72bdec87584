"""ExecutorSettings.answer_at_step_limit (budget forcing): when the steps run out without an
answer, one more turn asks for it; off, the episode ends BUDGET_EXHAUSTED without one. Real
executor, router, planner, sandbox, reward and store; the model is a stand-in whose reasoning
never ends within a turn (the turn is cut by its token limit, as an engine cuts it). What a
client reads of the asked-for answer: the live view and the gateway's stream."""

from __future__ import annotations

import pytest
from gearshift.api.common.v1.common_pb2 import Mode, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2
from gearshift.embedded import embedded
from gearshift.protocol import a2fm
from gearshift.protocol.sr2am import PLAN_HEAD
from gearshift.settings import ExecutorSettings
from gearshift.testing.scripted_policy import serve_scripted
from gearshift.services.gateway.translate import EpisodeView

from tests.libs.test_console import shown
from tests.services.executor.test_episode import solve

CALL = "<tool_call>\n{'id': 1, 'name': 'python', 'arguments': {'code': 'print(17*23)'}}\n</tool_call>"


def rambling_model(body: dict):
    """Answers when asked for the answer; otherwise reasons on without end, or calls python again."""
    messages = body.get("messages") or []
    last = messages[-1]["content"] if messages else ""
    if last.rstrip().endswith("<answer>"):
        return "391</answer>"
    if last.endswith(PLAN_HEAD):  # the configurator: act without a plan
        return " None"
    if "<reasoning>" in last:
        return {"content": " and 17*3 is 51, so the sum is", "finish_reason": "length"}
    return "Compute it.</plan>\n" + CALL


@pytest.fixture(params=[True, False], ids=["forcing", "no-forcing"])
async def stack(request, settings, postgres_url):
    async with serve_scripted(rambling_model) as policy_url:
        executor = ExecutorSettings(answer_at_step_limit=request.param, max_steps_other=2, max_steps_agentic=2)
        base = settings.with_policy(policy_url).model_copy(update={"database_url": postgres_url, "executor": executor})
        async with embedded(base) as platform:
            yield platform.settings, request.param


def forced_turn(trajectory) -> str:
    """The platform's text at the start of the last turn (its injected span)."""
    turn = trajectory.turns[-1]
    start, end = turn.injected_spans[0], turn.injected_spans[1]
    assert start == 0
    return turn.output[start:end]


async def test_reasoning_cut_at_every_step(stack):
    settings, forcing = stack
    trajectory = (await solve(settings, query="What is 17*23?", mode=Mode.MODE_REASONING, reference_answer="391"))[-1].final.trajectory
    if not forcing:
        assert trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_BUDGET_EXHAUSTED and trajectory.answer == ""
        assert len(trajectory.turns) == 2 and not trajectory.reward.format_valid and not a2fm.answer_was_asked(trajectory.turns)
        return
    assert trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED and trajectory.answer == "391"
    assert len(trajectory.turns) == 3  # two cut turns, then the one that asked for the answer
    assert forced_turn(trajectory) == "\n</reasoning>" + a2fm.FORCED_ANSWER_OPENER and a2fm.answer_was_asked(trajectory.turns)
    # the answer is right; the format was the executor's, not the policy's (so no SFT or APO learns it)
    assert trajectory.reward.correct and not trajectory.reward.format_valid


async def test_agentic_steps_used_up_on_calls(stack):
    settings, forcing = stack
    budget = executor_pb2.Budget(max_steps=1)
    trajectory = (await solve(settings, query="What is 17*23?", mode=Mode.MODE_AGENTIC, budget=budget, reference_answer="391"))[-1].final.trajectory
    assert trajectory.turns[0].tool_results[0].output.strip() == "391"
    if not forcing:
        assert trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_BUDGET_EXHAUSTED and trajectory.answer == ""
        assert len(trajectory.turns) == 1
        return
    assert trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED and trajectory.answer == "391"
    assert len(trajectory.turns) == 2 and forced_turn(trajectory) == a2fm.FORCED_ANSWER_OPENER
    assert trajectory.reward.correct and not trajectory.reward.format_valid


async def test_an_exhausted_token_budget_is_not_forced(stack):
    """The step limit is what forcing answers; a spent token budget stays spent."""
    settings, _ = stack
    budget = executor_pb2.Budget(max_output_tokens=8)
    trajectory = (await solve(settings, query="What is 17*23?", mode=Mode.MODE_REASONING, budget=budget))[-1].final.trajectory
    assert trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_BUDGET_EXHAUSTED and trajectory.answer == ""


async def test_clients_read_the_asked_for_answer_as_the_answer(stack):
    """The executor says when it asks for the answer: the live view and the OpenAI stream read
    what follows as the answer, not as more reasoning."""
    settings, forcing = stack
    events = await solve(settings, query="What is 17*23?", mode=Mode.MODE_REASONING, reference_answer="391")
    asked = [item for item in events if item.WhichOneof("event") == "answer_asked"]
    if not forcing:
        assert not asked
        return
    assert [item.answer_asked.opener for item in asked] == [forced_turn(events[-1].final.trajectory)]
    lines = shown(events)
    assert lines[-1] == "turn 3: the answer asked for" and not any("391" in line for line in lines)
    view = EpisodeView("", 0.0, stop=[])
    deltas = [view.on_event(item) for item in events]
    assert "".join(delta.content for delta in deltas) == "391"
    assert "391" not in "".join(delta.reasoning for delta in deltas)
