"""Report arithmetic against hand-computed figures, on hand-built trajectories stored in a real
store (the store service over gRPC, SQLite) and read back with Export."""

from __future__ import annotations

import math

import pytest
from gearshift.api.common.v1.common_pb2 import (
    Cost,
    Mode,
    Reward,
    RoutingStrategy,
    TokenUsage,
    ToolCall,
    Trajectory,
    TrajectoryStatus,
    Turn,
)
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.evaluation.report import build_report, compare, fetch_run, followed_protocol, pass_at_k, write_report
from gearshift.evaluation.runner import trajectory_id, verifier_name

SUITE = "hand"
COMPLETED, CANCELLED = TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED
FORCED, MODEL = RoutingStrategy.ROUTING_STRATEGY_FORCED, RoutingStrategy.ROUTING_STRATEGY_MODEL
I, R, A = Mode.MODE_INSTANT, Mode.MODE_REASONING, Mode.MODE_AGENTIC


def episode(run_id, item, difficulty, mode_name, sample, chosen, correct, cost, out_tokens, tool_calls=0,
            status=COMPLETED, created=100, attempt=0):
    forced = mode_name != "auto"
    trajectory = Trajectory(
        id=trajectory_id(run_id, item, mode_name, sample, attempt), query=f"question {item}", mode=chosen,
        requested_mode=chosen if forced else Mode.MODE_UNSPECIFIED, routing_strategy=FORCED if forced else MODEL,
        answer="x", status=status, usage=TokenUsage(input_tokens=10, output_tokens=out_tokens), cost=Cost(total_usd=cost),
        task_source=SUITE, split="test", run_id=run_id,
        labels={"item_id": item, "difficulty": difficulty, "domain": "d", "sample": str(sample)},
        turns=[Turn(index=0, tool_calls=[ToolCall(id=str(n), name="python") for n in range(tool_calls)])],
    )
    trajectory.created_at.FromSeconds(created)
    if correct is not None:
        trajectory.reward.CopyFrom(Reward(value=float(correct), correct=correct, kind="correctness", verifier=verifier_name(SUITE)))
    return trajectory


def run_a(run_id="run-a"):
    return [
        # instant: item a 1 of 2 correct, item b 0 of 2; a cancelled first attempt is ignored
        episode(run_id, "a", "1", "instant", 0, I, False, 0.005, 99, status=CANCELLED, created=50),
        episode(run_id, "a", "1", "instant", 0, I, True, 0.001, 10, attempt=1),
        episode(run_id, "a", "1", "instant", 1, I, False, 0.001, 20),
        episode(run_id, "b", "2", "instant", 0, I, False, 0.001, 30),
        episode(run_id, "b", "2", "instant", 1, I, False, 0.001, 40),
        # auto: item a routed instant twice (both correct), item b agentic (correct) and reasoning (wrong)
        episode(run_id, "a", "1", "auto", 0, I, True, 0.001, 10),
        episode(run_id, "a", "1", "auto", 1, I, True, 0.001, 10),
        episode(run_id, "b", "2", "auto", 0, A, True, 0.003, 50, tool_calls=2),
        episode(run_id, "b", "2", "auto", 1, R, False, 0.002, 30),
    ]


@pytest.fixture
async def store(settings):
    async with embedded(settings, ("store",)) as platform, channel(platform.settings.store_addr, platform.settings) as ch:
        yield store_pb2_grpc.TrajectoryStoreStub(ch)


def test_pass_at_k_matches_the_closed_form():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(3, 0, 3) == 0.0 and pass_at_k(3, 1, 3) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


async def test_report_figures_from_the_store(store, tmp_path):
    await store.Put(store_pb2.PutRequest(trajectories=run_a()))
    report = build_report(await fetch_run(store, "run-a"), "run-a", bootstrap_samples=500)
    assert list(report.modes) == ["instant", "auto"] and report.suite == SUITE and report.splits == ["test"]

    instant = report.modes["instant"]
    assert (instant.items, instant.trajectories, instant.correct, instant.k) == (2, 4, 1, 2)
    assert instant.pass_at_1 == pytest.approx((1 / 2 + 0) / 2)
    assert instant.pass_at_k == pytest.approx((1 + 0) / 2)
    assert instant.mean_output_tokens == pytest.approx(25.0)  # (10+20+30+40)/4, the cancelled 99 left out
    assert instant.mean_cost_usd == pytest.approx(0.001)
    assert instant.cost_of_pass_usd == pytest.approx(0.004 / 1)
    assert instant.statuses == {"completed": 4} and instant.mode_share == {}

    auto = report.modes["auto"]
    assert auto.pass_at_1 == pytest.approx((1 + 1 / 2) / 2) and auto.pass_at_k == pytest.approx(1.0)
    assert auto.mean_tool_calls == pytest.approx(2 / 4) and auto.mean_output_tokens == pytest.approx(25.0)
    assert auto.cost_of_pass_usd == pytest.approx(0.007 / 3)
    low, high = auto.cost_of_pass_ci
    assert 0.001 <= low <= auto.cost_of_pass_usd <= high  # the cheapest a pass can be is one $0.001 attempt
    assert auto.mode_share == pytest.approx({"instant": 0.5, "reasoning": 0.25, "agentic": 0.25})
    assert auto.mode_share_by_difficulty == {"1": {"instant": 1.0}, "2": {"reasoning": 0.5, "agentic": 0.5}}

    files = write_report(report, tmp_path / "out")
    assert sorted(path.name for path in files) == ["accuracy_cost.png", "mode_share.png", "report.json", "report.md"]
    assert all(path.stat().st_size > 0 for path in files)
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| instant | 2 | 4 | 0.250 | 0.500 (k=2) |" in text and "$0.002333" in text


async def test_ungraded_and_all_wrong(store):
    trajectories = [
        episode("run-u", "a", "1", "reasoning", 0, R, None, 0.002, 5),  # never graded by its suite
        episode("run-u", "b", "1", "reasoning", 0, R, False, 0.002, 5),
        episode("run-u", "c", "1", "reasoning", 0, R, None, 0.0, 0, status=TrajectoryStatus.TRAJECTORY_STATUS_FAILED),
    ]
    await store.Put(store_pb2.PutRequest(trajectories=trajectories))
    report = build_report(await fetch_run(store, "run-u"), "run-u", bootstrap_samples=200)
    reasoning = report.modes["reasoning"]
    assert (reasoning.ungraded, reasoning.correct, reasoning.pass_at_1) == (1, 0, 0.0)
    assert reasoning.trajectories == 2 and report.failed == {"reasoning": 1}  # counted, not scored
    assert math.isinf(reasoning.cost_of_pass_usd) and all(math.isinf(x) for x in reasoning.cost_of_pass_ci)


async def test_compare_two_runs(store):
    cheaper = [episode("run-b", t.labels["item_id"], t.labels["difficulty"], "auto" if t.routing_strategy == MODEL else "instant",
                       int(t.labels["sample"]), t.mode, t.reward.correct, t.cost.total_usd / 2, t.usage.output_tokens)
               for t in run_a("run-b") if t.status == COMPLETED]
    await store.Put(store_pb2.PutRequest(trajectories=run_a() + cheaper))
    a = build_report(await fetch_run(store, "run-a"), "run-a", bootstrap_samples=100)
    b = build_report(await fetch_run(store, "run-b"), "run-b", bootstrap_samples=100)
    deltas = {d.mode: d for d in compare(a, b)}
    assert set(deltas) == {"instant", "auto"}
    assert deltas["auto"].cost_of_pass_usd == pytest.approx((0.007 / 3, 0.0035 / 3))
    assert deltas["auto"].cost_of_pass_change == pytest.approx(-0.5)
    assert deltas["instant"].pass_at_1 == pytest.approx((0.25, 0.25))


def test_an_answer_the_executor_asked_for_is_not_the_policys_own_format():
    """Also where the stored verdict (from before the format check said so) is valid."""
    asked = Turn(index=2, output="\n</reasoning>\n<answer>391</answer>", injected_spans=[0, 22])
    own = Turn(index=1, output="17*23 = 391.</reasoning>\n<answer>391</answer>")
    stored = [Trajectory(reward=Reward(format_valid=True), turns=[Turn(index=0), turn]) for turn in (asked, own)]
    assert [followed_protocol(t) for t in stored] == [False, True]
