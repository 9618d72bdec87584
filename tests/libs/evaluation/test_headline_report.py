"""The headline report on hand-made trajectories: cost of pass, reductions, routing accuracy
against the per-item oracle, and the goal check, each against numbers worked out by hand."""

from __future__ import annotations

import uuid

import pytest
from gearshift.api.common.v1.common_pb2 import Cost, Mode, Reward, RoutingStrategy, Trajectory, TrajectoryStatus
from gearshift.evaluation.headline_report import build_headline, markdown
from gearshift.evaluation.runner import verifier_name

MODE = {"instant": Mode.MODE_INSTANT, "reasoning": Mode.MODE_REASONING, "agentic": Mode.MODE_AGENTIC}
FACTS = [f"facts-s1234-00000{i}" for i in range(4)]
GSM = ["gsm_symbolic-s1234-000001", "gsm_symbolic-s1234-000002"]
# Instant costs 1 and answers facts only; reasoning costs 12, agentic 20, both answer everything.
FORCED = {"instant": (1.0, set(FACTS)), "reasoning": (12.0, set(FACTS + GSM)), "agentic": (20.0, set(FACTS + GSM))}


def episode(item: str, eval_mode: str, chosen: str, cost: float, correct: bool) -> Trajectory:
    routed = eval_mode == "auto"
    return Trajectory(
        id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"hl/{item}/{eval_mode}/0")), run_id="hl", task_source="headline", split="test",
        mode=MODE[chosen], requested_mode=Mode.MODE_UNSPECIFIED if routed else MODE[chosen],
        routing_strategy=RoutingStrategy.ROUTING_STRATEGY_MODEL if routed else RoutingStrategy.ROUTING_STRATEGY_FORCED,
        status=TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, cost=Cost(total_usd=cost),
        reward=Reward(correct=correct, value=float(correct), verifier=verifier_name("headline"), format_valid=True),
        labels={"item_id": item, "eval_mode": eval_mode, "sample": "0"},
    )


def run(auto: dict[str, tuple[str, bool]]) -> list[Trajectory]:
    """The forced runs, plus auto choosing (mode, correct) per item at that mode's cost."""
    forced = [episode(i, m, m, cost, i in right) for m, (cost, right) in FORCED.items() for i in FACTS + GSM]
    return forced + [episode(i, "auto", m, FORCED[m][0], ok) for i, (m, ok) in auto.items()]


def test_an_oracle_router_meets_the_goal():
    report = build_headline(run({i: ("instant", True) for i in FACTS} | {i: ("reasoning", True) for i in GSM}), "hl",
                            bootstrap_samples=2000)
    # cost of pass: instant 6/4 = 1.5, reasoning 72/6 = 12, agentic 120/6 = 20, auto (4 * 1 + 2 * 12)/6 = 14/3
    assert {m: r.cost_of_pass_usd for m, r in report.modes.items()} == pytest.approx(
        {"instant": 1.5, "reasoning": 12.0, "agentic": 20.0, "auto": 14 / 3})
    auto = report.reductions["auto"]
    assert auto["reasoning"].value == pytest.approx(1 - 14 / 36) and auto["agentic"].value == pytest.approx(1 - 14 / 60)
    assert auto["instant"].value == pytest.approx(1 - (14 / 3) / 1.5)
    # auto saves on every fact and ties on word problems: only a resample of word problems alone
    # (probability (1/3)^6 = 0.14%, under the 2.5% tail) saves nothing, so the interval is above 0.
    assert auto["reasoning"].low > 0 and auto["agentic"].low > 0
    assert report.routing_accuracy["auto"] == {"accuracy": 1.0, "items": 6.0, "items_without_oracle": 0.0}
    assert report.mode_share_by_family["auto"] == {"facts": {"instant": 1.0}, "gsm_symbolic": {"reasoning": 1.0}}
    assert report.items_per_family == {"facts": 4, "gsm_symbolic": 2}
    assert report.goal_met and report.goal[0].met
    assert "Goal check: MET" in markdown(report)


def test_a_forced_mode_that_breaks_the_protocol_too_often_misses_the_goal():
    trajectories = run({i: ("instant", True) for i in FACTS} | {i: ("reasoning", True) for i in GSM})
    broken = next(t for t in trajectories if t.labels["eval_mode"] == "agentic")
    broken.reward.format_valid = False  # 5 of 6 forced agentic episodes valid: 83% < 95%
    report = build_headline(trajectories, "hl", bootstrap_samples=200)
    assert report.goal[0].met and not report.goal_met  # the router alone would meet it
    assert report.validity.reasons == ["ok: forced instant protocol valid 100.0% (need >= 95%)",
                                       "ok: forced reasoning protocol valid 100.0% (need >= 95%)",
                                       "NOT MET: forced agentic protocol valid 83.3% (need >= 95%)"]
    assert "Goal check: NOT MET" in markdown(report) and "`forced modes`: not met" in markdown(report)


def test_a_router_that_loses_accuracy_misses_the_goal():
    # auto sends one fact to agentic and answers one word problem wrongly: 5/6 correct.
    auto = {i: ("instant", True) for i in FACTS} | {FACTS[1]: ("agentic", True), GSM[0]: ("reasoning", True), GSM[1]: ("reasoning", False)}
    report = build_headline(run(auto), "hl", bootstrap_samples=500)
    assert report.modes["auto"].pass_at_1 == pytest.approx(5 / 6)
    assert report.modes["auto"].cost_of_pass_usd == pytest.approx((3 * 1 + 20 + 2 * 12) / 5)  # 9.4: 1 - 9.4/12 = 21.7%
    assert report.reductions["auto"]["reasoning"].value == pytest.approx(1 - 9.4 / 12)
    assert not report.goal_met
    reasons = report.goal[0].reasons
    assert reasons[0].startswith("NOT MET: +21.7% vs forced reasoning")
    assert reasons[2].startswith("NOT MET: accuracy 83.3%, -16.7 points against the best forced mode (reasoning")
    # the oracle is instant on facts and reasoning on word problems: 5 of 6 choices match
    assert report.routing_accuracy["auto"]["accuracy"] == pytest.approx(5 / 6)


def test_a_failed_episode_is_left_out_and_counted():
    trajectories = run({i: ("instant", True) for i in FACTS})
    trajectories.append(episode(GSM[0], "auto", "instant", 0.0, False))
    trajectories[-1].status = TrajectoryStatus.TRAJECTORY_STATUS_FAILED
    report = build_headline(trajectories, "hl", bootstrap_samples=100)
    assert report.failed == {"auto": 1} and report.modes["auto"].items == 4
    # paired on the four facts auto answered: 4 / 4 against reasoning's 48 / 4 on the same items
    assert report.reductions["auto"]["reasoning"].value == pytest.approx(1 - 1 / 12)


def test_a_jsonl_suites_family_label_groups_it_and_flat_pricing_is_reported_beside_the_billed():
    trajectories = run({i: ("instant", True) for i in FACTS} | {i: ("reasoning", True) for i in GSM})
    rows = {item: f"row-{n}" for n, item in enumerate(FACTS + GSM)}  # a JSONL suite's own ids: no family in them
    for t in trajectories:
        t.labels["family"] = "capitals" if t.labels["item_id"] in FACTS else "word problems"
        t.labels["item_id"] = rows[t.labels["item_id"]]
        # The prefix cache served half of agentic's input: billed 20, 40 at the full price.
        t.cost.flat_total_usd = 2 * t.cost.total_usd if t.mode == Mode.MODE_AGENTIC else t.cost.total_usd
    report = build_headline(trajectories, "hl", bootstrap_samples=200)
    assert report.items_per_family == {"capitals": 4, "word problems": 2}
    assert report.accuracy_by_family["instant"] == {"capitals": 1.0, "word problems": 0.0}
    assert report.mode_share_by_family["auto"] == {"capitals": {"instant": 1.0}, "word problems": {"reasoning": 1.0}}
    assert report.modes["agentic"].cost_of_pass_usd == pytest.approx(20.0)
    assert report.modes["agentic"].flat_cost_of_pass_usd == pytest.approx(40.0)
    assert report.reductions["auto"]["agentic"].value == pytest.approx(1 - (14 / 3) / 20)
    assert report.flat_reductions["auto"]["agentic"].value == pytest.approx(1 - (14 / 3) / 40)
    written = markdown(report)
    assert "| mode | capitals | word problems |" in written and "| instant | 100.0% | 0.0% |" in written
    assert "flat: every input token at the full rate" in written
