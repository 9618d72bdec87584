"""End to end over real gRPC with the real model: every mode through the executor, with the
router, planner, sandbox, reward and store (Postgres) each on its own loopback port, against
the built-in policy server and against vLLM's CPU server. Small budgets keep it quick."""

from __future__ import annotations

import psycopg
import pytest
from gearshift.api.common.v1.common_pb2 import Mode, RoutingStrategy, Trajectory, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.protocol.a2fm import answer_was_asked, episode_prefix, render_transcript
from gearshift.protocol.modes import mode_name
from gearshift.settings import ExecutorSettings, PlannerSettings, RouterSettings
from gearshift.training.tokenization import sampled_prefix
from transformers import AutoTokenizer

QUESTION, REFERENCE = "What is the capital of France?", "Paris"
SMALL = {
    "executor": ExecutorSettings(max_tokens_per_turn=40, max_steps_agentic=2, max_steps_other=1),
    "planner": PlannerSettings(max_tokens=48, max_horizon=2),
    "router": RouterSettings(max_attempts=2, max_tokens=48),
}


async def solve_every_mode(settings) -> dict[int, tuple[list[str], Trajectory]]:
    results = {}
    async with embedded(settings) as platform, channel(platform.settings.executor_addr, platform.settings) as ch:
        stub = executor_pb2_grpc.ExecutorStub(ch)
        for mode in (Mode.MODE_INSTANT, Mode.MODE_REASONING, Mode.MODE_AGENTIC, Mode.MODE_UNSPECIFIED):
            events = [e async for e in stub.Solve(executor_pb2.SolveRequest(query=QUESTION, mode=mode, reference_answer=REFERENCE))]
            results[mode] = ([e.WhichOneof("event") for e in events], events[-1].final.trajectory)
    return results


def check(results: dict, database_url: str) -> None:
    for mode, (kinds, trajectory) in results.items():
        assert kinds[0] == "mode_chosen" and kinds[-1] == "final" and "chunk" in kinds
        if mode:
            assert trajectory.mode == mode and trajectory.routing_strategy == RoutingStrategy.ROUTING_STRATEGY_FORCED
        else:
            assert trajectory.routing_strategy == RoutingStrategy.ROUTING_STRATEGY_MODEL and trajectory.mode
        # The status says how the transcript ended: an answer (asked for in one more turn when the
        # mode's turns ran out), or the turns used up inside an answer too long for them.
        steps = SMALL["executor"].max_steps_agentic if trajectory.mode == Mode.MODE_AGENTIC else SMALL["executor"].max_steps_other
        if trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED:
            assert "<answer>" in render_transcript(trajectory) and trajectory.answer == trajectory.answer.strip()
            assert len(trajectory.turns) <= steps + answer_was_asked(trajectory.turns)
        else:
            assert trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_BUDGET_EXHAUSTED, TrajectoryStatus.Name(trajectory.status)
            assert trajectory.answer == "" and len(trajectory.turns) == steps
        assert trajectory.turns and trajectory.usage.output_tokens > 0 and trajectory.cost.total_usd > 0
        assert trajectory.HasField("reward") and trajectory.reward.correct == (trajectory.reward.value > 0)
    agentic = results[Mode.MODE_AGENTIC][1]
    assert all(turn.plan_decision for turn in agentic.turns if turn.tool_calls or turn.index == 0)
    # Each call of an agentic episode re-sends the conversation: the engine serves that prefix from
    # its cache, says so, and it is priced at the cached-input rate.
    assert 0 < agentic.usage.cached_input_tokens < agentic.usage.input_tokens
    assert all(turn.usage.cached_input_tokens <= turn.usage.input_tokens for turn in agentic.turns)
    assert agentic.cost.total_usd < agentic.cost.flat_total_usd

    ids = [trajectory.id for _, trajectory in results.values()]
    with psycopg.connect(database_url.replace("postgresql+psycopg", "postgresql")) as db:
        rows = db.execute("SELECT id, payload FROM trajectories WHERE id = ANY(%s)", (ids,)).fetchall()
    stored = {row[0]: Trajectory.FromString(row[1]) for row in rows}
    for _, trajectory in results.values():
        assert stored[trajectory.id].turns == trajectory.turns  # the full trajectory, turn by turn


@pytest.mark.model
async def test_every_mode_with_the_builtin_policy_server(settings, postgres_url, builtin_policy):
    configured = settings.with_policy(builtin_policy).model_copy(update={"database_url": postgres_url, **SMALL})
    check(await solve_every_mode(configured), postgres_url)


@pytest.mark.model
@pytest.mark.vllm
async def test_every_mode_with_vllm(settings, postgres_url, vllm_policy):
    configured = settings.with_policy(vllm_policy).model_copy(update={"database_url": postgres_url, **SMALL})
    check(await solve_every_mode(configured), postgres_url)


async def solve_the_demo(settings) -> list[Trajectory]:
    from gearshift.cli.platform import DEMO_QUESTIONS

    async with embedded(settings) as platform, channel(platform.settings.executor_addr, platform.settings) as ch:
        stub = executor_pb2_grpc.ExecutorStub(ch)
        return [[e async for e in stub.Solve(executor_pb2.SolveRequest(query=q, reference_answer=r))][-1].final.trajectory
                for q, r, _ in DEMO_QUESTIONS]


async def check_the_demo(settings, postgres_url, smollm2_dir) -> None:
    """The default policy routes and answers each demo question itself (none is in its training
    data), each in the mode one would expect; every model call kept the token ids it sampled."""
    from gearshift.cli.platform import DEMO_QUESTIONS

    solved = await solve_the_demo(settings.model_copy(update={"database_url": postgres_url}))
    outcome = [(mode_name(t.mode), t.reward.correct, t.reward.format_valid) for t in solved]
    assert outcome == [(mode, True, True) for _, _, mode in DEMO_QUESTIONS], [t.answer for t in solved]
    check_sampled_tokens(solved, AutoTokenizer.from_pretrained(smollm2_dir))


def check_sampled_tokens(trajectories: list[Trajectory], tokenizer) -> None:
    """The routing head and each turn kept what the policy sampled, and the ids decode to the
    stored text all through, short of the line the platform ends a block with."""
    for trajectory in trajectories:
        assert trajectory.routing_sampled and all(turn.sampled for turn in trajectory.turns)
        head = episode_prefix(trajectory.mode, trajectory.routing_rationale)
        kept = [head[s.start : s.end] for s in trajectory.routing_sampled]
        kept += [turn.output[s.start : s.end] for turn in trajectory.turns for s in turn.sampled]
        spans = list(trajectory.routing_sampled) + [s for turn in trajectory.turns for s in turn.sampled]
        for text, span in zip(kept, spans):
            _, chars = sampled_prefix(tokenizer, tuple(span.token_ids), text)
            assert text[chars:] in ("", "\n"), (text, tokenizer.decode(span.token_ids))


@pytest.mark.model
async def test_the_builtin_server_serves_the_default_policy_folded(settings, postgres_url, builtin_default_policy, smollm2_dir):
    await check_the_demo(settings.with_policy(builtin_default_policy), postgres_url, smollm2_dir)


@pytest.mark.model
@pytest.mark.vllm
async def test_vllm_serves_the_default_policy_as_a_lora_module(settings, postgres_url, vllm_policy, smollm2_dir):
    await check_the_demo(settings.with_policy(vllm_policy, model="default"), postgres_url, smollm2_dir)
