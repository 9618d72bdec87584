"""An agentic episode through every configurator decision (PLAN_NEW, CONTINUE, ACT) and the
forced-answer path, run by the real executor, router, planner, sandbox, reward and store, with
the ScriptedPolicy stand-in as the model. What the executor wrote is then checked by the
strict SR2AM checker, the format check, the training masks and the price table: the trajectory
accounts for every model call of the episode."""

from __future__ import annotations

import pytest
from gearshift.api.common.v1.common_pb2 import PlanDecision, Sampling, TokenUsage
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.pricing import CostTable
from gearshift.protocol import a2fm
from gearshift.rewards.formats import check_trajectory_format
from gearshift.rewards.scoring import SR2AM, score_rollouts
from gearshift.rewards.structure import check_structure
from gearshift.settings import RewardSettings
from gearshift.testing.scripted_policy import _cut, _usage, serve_scripted
from gearshift.training.tokenization import assistant_segments

from tests.libs.rewards.trajectories import rollout

CALL = "<tool_call>\n{{'id': {n}, 'name': 'python', 'arguments': {{'code': 'print(17*23)'}}}}\n</tool_call>"
PLAN = " need 17*23\n- Action: run python\n- Expected Outcome: the product is known\n- Next Action: check it\n- Expected Outcome: it is checked"


class Model:
    """Routes to tools, asks for a plan, then continues it, then acts; its last turn has neither
    a call nor an answer, so the executor must ask for the answer. Records every call it served."""

    def __init__(self):
        self.calls: list[tuple[dict, str]] = []
        # How it goes on after "Plan:" in its own message: a new plan, an empty line, "None".
        self.decisions = iter(["\n- Current State:", "\n\n", " None"])
        self.turns = iter([f"Goal: compute 17*23.</plan>\n{CALL.format(n=1)}", f"Check once more.\n{CALL.format(n=2)}",
                           "The product is 391."])

    def __call__(self, body: dict) -> str:
        last = body["messages"][-1]["content"]
        if "</classification>" in (body.get("stop") or []):
            text = "Arithmetic is safer with a tool.\n<classification>\ntoolcalling_agent\n</classification>"
        elif last.endswith("Plan:\n- Current State:"):
            text = PLAN
        elif last.endswith("Plan:"):
            text = next(self.decisions)
        elif last.endswith("<answer>"):
            text = "391</answer>"
        else:
            text = next(self.turns)
        self.calls.append((body, _cut(text, body.get("stop") or [])))
        return text


@pytest.fixture
async def episode(settings, postgres_url):
    model = Model()
    async with serve_scripted(model) as url:
        configured = settings.with_policy(url).model_copy(update={"database_url": postgres_url})
        async with embedded(configured) as platform, channel(platform.settings.executor_addr, platform.settings) as ch:
            request = executor_pb2.SolveRequest(query="What is 17*23?", reference_answer="391")
            events = [e async for e in executor_pb2_grpc.ExecutorStub(ch).Solve(request)]
    return events[-1].final.trajectory, model, configured


async def test_every_decision_and_the_forced_answer_pass_the_strict_checks(episode):
    trajectory, _, _ = episode
    assert [t.plan_decision for t in trajectory.turns] == [
        PlanDecision.PLAN_DECISION_PLAN_NEW, PlanDecision.PLAN_DECISION_CONTINUE, PlanDecision.PLAN_DECISION_ACT,
        PlanDecision.PLAN_DECISION_UNSPECIFIED,  # the forced-answer turn: nobody regulated it
    ]
    assert trajectory.answer == "391" and trajectory.reward.correct and check_structure(trajectory.turns)
    # The answer was asked for: graded, but not the policy's own format (as natively, where a turn
    # with neither a call nor an answer is invalid)...
    assert not trajectory.reward.format_valid
    assert check_trajectory_format(trajectory).reason == "the executor asked for the answer"
    # ... while SR2AM's structure term judges the plan blocks, which were all well-formed.
    (reward,) = score_rollouts([trajectory], "391", SR2AM, RewardSettings()).rewards
    assert reward.value == 1.0  # correct with valid structure, not capped at 0.8


async def test_a_correct_instant_answer_is_not_capped_by_the_structure_reward(settings):
    instant = rollout(1, "391")
    (reward,) = score_rollouts([instant], "391", SR2AM, settings.reward).rewards
    assert reward.value == 1.0


async def test_training_masks_exactly_what_the_executor_injected(episode):
    trajectory, _, _ = episode
    segments = assistant_segments(trajectory)
    assert "".join(s.text for s in segments) == a2fm.render_transcript(trajectory)
    masked = [s.text for s in segments if not s.target]
    assert "<plan>" in masked and a2fm.FORCED_ANSWER_OPENER in masked
    learned = "".join(s.text for s in segments if s.target)
    assert "Plan:\n- Current State: need 17*23" in learned and "\nPlan:\n\n" in learned and "\nPlan: None\n" in learned
    assert "391</answer>" in learned and "Results for tool call" not in learned


async def test_each_sample_is_kept_where_its_text_landed(episode):
    """Every model call's token ids are kept at the text it wrote (the stand-in's ids are its
    characters): the routing head, the configurator's decision after "Plan:", the plan, each
    generation with the stop word it closed. Where the platform wrote on (the line ending a
    block) the text runs past the sample; the openers it injected are in no span."""
    trajectory, _, _ = episode
    (routing,) = trajectory.routing_sampled
    head = a2fm.episode_prefix(trajectory.mode, trajectory.routing_rationale)
    kept = [(head[routing.start : routing.end], routing)] + [
        (turn.output[span.start : span.end], span) for turn in trajectory.turns for span in turn.sampled
    ]
    said = [(text, "".join(map(chr, span.token_ids))) for text, span in kept]  # (kept text, what the ids say)
    assert [len(turn.sampled) for turn in trajectory.turns] == [3, 2, 2, 1]  # decision, plan, generation; ...; forced answer
    assert said[0][1].startswith("Arithmetic is safer") and said[0][0] == said[0][1] + "\n"
    assert said[1] == ("\n- Current State:", "\n- Current State:")  # turn 0: PLAN_NEW ...
    assert said[2] == (PLAN + "\n", PLAN)  # ... its plan ...
    assert said[3][0] == said[3][1] and said[3][1].endswith(CALL.format(n=1))  # ... and the call, stop word included
    assert said[4] == ("\n\n", "\n\n") and said[6] == (" None\n", " None")  # CONTINUE, ACT
    assert said[-1] == ("391</answer>", "391</answer>")  # the forced answer, after the injected opener
    for turn in trajectory.turns:
        for start, end in zip(turn.injected_spans[::2], turn.injected_spans[1::2]):
            assert all(span.end <= start or span.start >= end for span in turn.sampled)


async def test_usage_and_cost_are_the_sum_of_every_model_call(episode):
    trajectory, model, configured = episode
    kinds = {"route": 0, "regulate": 0, "plan": 0, "generate": 0}
    expected = TokenUsage()
    for body, text in model.calls:
        usage = _usage(body, text)
        expected.input_tokens += usage["prompt_tokens"]
        expected.output_tokens += usage["completion_tokens"]
        last = body["messages"][-1]["content"]
        kind = ("route" if "</classification>" in (body.get("stop") or []) else "plan" if last.endswith("Plan:\n- Current State:")
                else "regulate" if last.endswith("Plan:") else "generate")
        kinds[kind] += 1
    assert kinds == {"route": 1, "regulate": 3, "plan": 1, "generate": 4}
    assert trajectory.usage == expected
    assert sum(t.usage.input_tokens for t in trajectory.turns) < expected.input_tokens  # routing is the trajectory's own
    priced = CostTable.from_prices(configured.prices).price_trajectory(trajectory)
    assert trajectory.cost == priced and trajectory.cost.tools_usd > 0


async def test_rollout_sampling_reaches_every_model_call(settings, postgres_url):
    model = Model()
    async with serve_scripted(model) as url:
        configured = settings.with_policy(url).model_copy(update={"database_url": postgres_url})
        async with embedded(configured) as platform, channel(platform.settings.executor_addr, platform.settings) as ch:
            request = executor_pb2.SolveRequest(query="What is 17*23?", sampling=Sampling(temperature=0.7, top_p=0.95))
            [e async for e in executor_pb2_grpc.ExecutorStub(ch).Solve(request)]
    assert {(body["temperature"], body["top_p"]) for body, _ in model.calls} == {(0.7, 0.95)}  # routing and planning too
    assert not any("seed" in body for body, _ in model.calls)  # unseeded


async def test_a_seeded_episode_gives_each_model_call_its_own_seed_in_order(settings, postgres_url):
    model = Model()
    async with serve_scripted(model) as url:
        configured = settings.with_policy(url).model_copy(update={"database_url": postgres_url})
        async with embedded(configured) as platform, channel(platform.settings.executor_addr, platform.settings) as ch:
            request = executor_pb2.SolveRequest(query="What is 17*23?", sampling=Sampling(temperature=0.7, top_p=0.95, seed=41))
            [e async for e in executor_pb2_grpc.ExecutorStub(ch).Solve(request)]
    # Routing, three regulations, the plan and four turns: the k-th call samples with seed + k.
    assert [body["seed"] for body, _ in model.calls] == list(range(41, 50))
