"""The executor's episode loop over real gRPC against the real router, planner, sandbox, reward
and store (Postgres). The model is the ScriptedPolicy stand-in, so tool calls, malformed calls
and answers happen deterministically; tests/e2e runs the same path with the real model."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import Mode, PlanDecision, RoutingStrategy, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.protocol import a2fm, sr2am
from gearshift.testing.scripted_policy import serve_scripted

CALLS = (
    "I will compute it.\n<tool_call>\n"
    "{'id': 1, 'name': 'python', 'arguments': {'code': 'print(17*23)'}}\n"
    "{'id': 2, 'name': 'no_such_tool', 'arguments': {}}\n"
    "</tool_call>"
)


def scripted_model(body: dict) -> str:
    """Answers like a well-trained policy: routes to tools for arithmetic, plans, calls python."""
    stop = body.get("stop") or []
    messages = body.get("messages") or []
    last = messages[-1]["content"] if messages else ""
    if "</classification>" in stop:
        return "Arithmetic is safer with a tool.\n<classification>\ntoolcalling_agent\n</classification>"
    if last.endswith("Plan:"):  # the configurator's decision: a new plan
        return "\n- Current State:"
    if last.endswith("Plan:\n- Current State:"):
        return " need 17*23\n- Action: run python\n- Expected Outcome: the product\n- Next Action: answer\n- Expected Outcome: done"
    if "<tool_response>" in last:
        return "The tool says 391.\n<answer>391</answer>"
    if last.rstrip().endswith("<answer>"):
        return "42</answer>"
    if last.rstrip().endswith("<reasoning>"):
        return "17*23 = 391.</reasoning>\n<answer>391</answer>"
    return "Goal: compute 17*23.</plan>\n" + CALLS


@pytest.fixture
async def stack(settings, postgres_url):
    async with serve_scripted(scripted_model) as policy_url:
        base = settings.with_policy(policy_url).model_copy(update={"database_url": postgres_url})
        async with embedded(base) as platform:
            running = platform.settings
            yield running


async def solve(settings, **fields) -> list[executor_pb2.SolveEvent]:
    async with channel(settings.executor_addr, settings) as ch:
        return [item async for item in executor_pb2_grpc.ExecutorStub(ch).Solve(executor_pb2.SolveRequest(**fields))]


async def stored(settings, trajectory_id: str):
    async with channel(settings.store_addr, settings) as ch:
        return (await store_pb2_grpc.TrajectoryStoreStub(ch).Get(store_pb2.GetRequest(id=trajectory_id))).trajectory


async def test_agentic_episode_plans_calls_tools_answers_and_is_stored(stack):
    events = await solve(stack, query="What is 17*23?", reference_answer="391")
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "mode_chosen" and kinds[-1] == "final"
    assert events[0].mode_chosen.mode == Mode.MODE_AGENTIC
    assert events[0].mode_chosen.strategy == RoutingStrategy.ROUTING_STRATEGY_MODEL
    assert kinds.index("plan") < kinds.index("tool_call") < kinds.index("tool_result") < kinds.index("answer")

    results = [e.tool_result for e in events if e.WhichOneof("event") == "tool_result"]
    assert results[0].output.strip() == "391" and not results[0].is_error
    assert results[1].is_error and results[1].name == ""  # the unknown tool never reached the sandbox

    trajectory = events[-1].final.trajectory
    assert trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED
    assert trajectory.answer == "391" and trajectory.reward.correct
    assert trajectory.reward.format_valid  # the A^2FM format, judged on the replayed transcript
    first, second = trajectory.turns
    assert first.plan_decision == PlanDecision.PLAN_DECISION_PLAN_NEW and len(first.plan.steps) == 2
    assert [c.name for c in first.tool_calls] == ["python"]
    assert trajectory.planning.mean_plan_depth == 2
    assert trajectory.usage.input_tokens > 0 and trajectory.cost.total_usd > 0
    assert trajectory.cost.tools_usd > 0  # one python call is priced

    again = await stored(stack, trajectory.id)
    assert again == trajectory


async def test_malformed_calls_become_observations_and_the_transcript_replays(stack):
    events = await solve(stack, query="What is 17*23?")
    trajectory = events[-1].final.trajectory
    results = trajectory.turns[0].tool_results
    assert [(r.call_id, r.is_error) for r in results] == [("1", False), ("rejected-1", True)]
    assert "unknown tool 'no_such_tool'" in results[1].error

    transcript = a2fm.render_transcript(trajectory)
    assert transcript.startswith("Arithmetic is safer with a tool.\n<classification>\ntoolcalling_agent\n</classification>\nPlan:\n- Current State: need 17*23")
    assert "- Expected Outcome: done\n<plan>Goal: compute 17*23.</plan>" in transcript
    assert "Results for tool call 1:\n391\nResults for tool call rejected-1:\nError: Call on line 2 names unknown tool" in transcript
    assert transcript.endswith("<answer>391</answer>")


@pytest.mark.parametrize(
    ("mode", "answer"),
    [(Mode.MODE_INSTANT, "42"), (Mode.MODE_REASONING, "391")],
)
async def test_forced_direct_modes(stack, mode, answer):
    events = await solve(stack, query="What is 17*23?", mode=mode, reference_answer="391")
    trajectory = events[-1].final.trajectory
    assert trajectory.mode == mode and trajectory.routing_strategy == RoutingStrategy.ROUTING_STRATEGY_FORCED
    assert trajectory.answer == answer and trajectory.reward.correct == (answer == "391")
    assert trajectory.reward.format_valid
    assert not any(turn.tool_calls for turn in trajectory.turns)


async def test_retry_with_the_same_id_does_not_run_twice(stack):
    trajectory_id = str(uuid.uuid4())
    first = (await solve(stack, query="What is 17*23?", trajectory_id=trajectory_id))[-1].final.trajectory
    events = await solve(stack, query="What is 17*23?", trajectory_id=trajectory_id)
    assert [e.WhichOneof("event") for e in events] == ["final"]
    assert events[0].final.trajectory == first


@pytest.mark.parametrize(
    "fields",
    [
        {"query": ""},
        {"query": "x" * 40_000},
        {"query": "hi", "mode": 9},
        {"query": "hi", "trajectory_id": "not-a-uuid"},
        {"query": "hi", "budget": executor_pb2.Budget(max_steps=-1)},
        {"query": "hi", "strategy": 9},
    ],
)
async def test_bad_requests_are_invalid_argument_and_store_nothing(stack, fields):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await solve(stack, **fields)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    async with channel(stack.store_addr, stack) as ch:
        page = await store_pb2_grpc.TrajectoryStoreStub(ch).Query(store_pb2.QueryRequest(page_size=500))
    assert not any(t.query in ("", "hi") or len(t.query) > 32_000 for t in page.trajectories)


async def test_cancelled_episode_is_stored_as_cancelled(stack):
    trajectory_id = str(uuid.uuid4())
    async with channel(stack.executor_addr, stack) as ch:
        call = executor_pb2_grpc.ExecutorStub(ch).Solve(executor_pb2.SolveRequest(query="What is 17*23?", trajectory_id=trajectory_id))
        async for item in call:
            if item.WhichOneof("event") == "tool_call":
                call.cancel()
                break
    for _ in range(50):  # the server stores the partial trajectory right after the cancel
        try:
            trajectory = await stored(stack, trajectory_id)
            break
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.1)
    assert trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED


async def test_a_downstream_refusal_reaches_the_client_with_its_status(stack):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await solve(stack, query="What is 17*23?", strategy=RoutingStrategy.ROUTING_STRATEGY_LEARNED)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # no learned router is published
    assert "downstream: no learned router" in err.value.details()


async def test_the_planner_continues_the_agents_own_message(settings, postgres_url):
    """The plan is asked for in the agent's context (its message so far, then the block's
    opener): the context the policy's plan blocks are learned in, not a prompt of its own."""
    asked = []

    def recording(body: dict) -> str:
        messages = body.get("messages") or []
        if messages and messages[-1]["content"].endswith(sr2am.PLAN_OPENER):
            asked.append(messages)
        return scripted_model(body)

    async with serve_scripted(recording) as policy_url:
        async with embedded(settings.with_policy(policy_url).model_copy(update={"database_url": postgres_url})) as platform:
            events = await solve(platform.settings, query="What is 17*23?")
    trajectory = events[-1].final.trajectory
    system, user, assistant = asked[0]  # the first turn's plan
    assert system["role"] == "system" and user == {"role": "user", "content": "What is 17*23?"}
    head = assistant["content"].removesuffix(sr2am.PLAN_OPENER)
    assert head.endswith("</classification>\n")  # the routing head the block follows
    assert a2fm.render_transcript(trajectory).startswith(head + sr2am.render_plan(trajectory.turns[0].plan) + "\n")
