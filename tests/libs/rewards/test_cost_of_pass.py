"""Cost of pass on hand-computed numbers, and its bootstrap interval."""

from __future__ import annotations

import math

import pytest
from gearshift.rewards.cost_of_pass import compute_cost_of_pass, cost_of_pass


def test_total_cost_over_correct_answers():
    result = compute_cost_of_pass([0.01, 0.02, 0.03, 0.04], [True, False, True, False], samples=500)
    # (0.01 + 0.02 + 0.03 + 0.04) / 2 correct = 0.05
    assert result.cost_of_pass_usd == pytest.approx(0.05)
    assert (result.attempts, result.correct, result.total_cost_usd) == (4, 2, pytest.approx(0.10))
    assert result.ci_low_usd <= result.cost_of_pass_usd <= result.ci_high_usd


def test_a2fm_style_comparison():
    # Expected cost per attempt / success probability: 0.002 / 0.4 = 0.005.
    result = compute_cost_of_pass([0.002] * 10, [True] * 4 + [False] * 6, samples=200)
    assert result.cost_of_pass_usd == pytest.approx(0.005)


def test_no_correct_answer_is_infinite():
    assert cost_of_pass(1.0, 0) == math.inf
    result = compute_cost_of_pass([0.5, 0.5], [False, False], samples=100)
    assert result.cost_of_pass_usd == math.inf and result.ci_low_usd == math.inf


def test_interval_by_hand():
    # Attempts a (cost 2, correct) and b (cost 0, wrong). Resamples: aa -> 4/2, ab/ba -> 2/1,
    # bb -> no correct answer (+inf, probability 1/4). So 2 is the lower end and +inf the upper.
    result = compute_cost_of_pass([2.0, 0.0], [True, False], samples=400, seed=7)
    assert result.cost_of_pass_usd == 2.0
    assert (result.ci_low_usd, result.ci_high_usd) == (2.0, math.inf)


def test_identical_attempts_have_a_point_interval():
    result = compute_cost_of_pass([0.3] * 5, [True] * 5, samples=100)
    assert result.ci_low_usd == pytest.approx(0.3) and result.ci_high_usd == pytest.approx(0.3)


def test_seeded_and_reproducible_over_several_chunks():
    costs = [0.001 * (i % 7 + 1) for i in range(3000)]
    correct = [i % 3 != 0 for i in range(3000)]
    first = compute_cost_of_pass(costs, correct, samples=2000, seed=11)  # 1333 resamples per chunk
    assert first == compute_cost_of_pass(costs, correct, samples=2000, seed=11)
    assert first.ci_low_usd < first.cost_of_pass_usd < first.ci_high_usd
    assert first.ci_high_usd / first.ci_low_usd < 1.2  # 3000 attempts: a narrow interval
    narrower = compute_cost_of_pass(costs, correct, samples=2000, confidence=0.5, seed=11)
    assert first.ci_low_usd < narrower.ci_low_usd < narrower.ci_high_usd < first.ci_high_usd


def test_the_bootstrap_resamples_items_not_attempts():
    # Two items, four samples each: item a (cost 1 each) always right, item b (cost 1) always
    # wrong. Resampling items, half the resamples draw b twice: no correct answer, +inf.
    # Resampling the eight attempts as if independent almost never draws eight b's.
    costs, correct, items = [1.0] * 8, [True] * 4 + [False] * 4, ["a"] * 4 + ["b"] * 4
    by_item = compute_cost_of_pass(costs, correct, samples=400, seed=3, items=items)
    by_attempt = compute_cost_of_pass(costs, correct, samples=400, seed=3)
    assert by_item.cost_of_pass_usd == by_attempt.cost_of_pass_usd == 2.0 and by_item.attempts == 8
    assert by_item.ci_high_usd == math.inf and by_attempt.ci_high_usd < math.inf
    assert by_item.ci_low_usd == 1.0  # both draws item a: 8 / 8


def test_one_item_per_attempt_is_the_attempt_bootstrap():
    costs, correct = [0.001 * (i % 5 + 1) for i in range(50)], [i % 4 != 0 for i in range(50)]
    assert compute_cost_of_pass(costs, correct, 500, seed=1) == compute_cost_of_pass(
        costs, correct, 500, seed=1, items=[f"{i:03d}" for i in range(50)])


@pytest.mark.parametrize(
    ("costs", "correct", "kwargs"),
    [
        ([], [], {}),
        ([1.0], [True, False], {}),
        ([-0.1], [True], {}),
        ([math.nan], [True], {}),
        ([1.0], [True], {"confidence": 1.0}),
        ([1.0], [True], {"samples": 0}),
        ([1.0, 2.0], [True, True], {"items": ["a"]}),
    ],
)
def test_bad_input(costs, correct, kwargs):
    with pytest.raises(ValueError):
        compute_cost_of_pass(costs, correct, **{"samples": 10, **kwargs})
