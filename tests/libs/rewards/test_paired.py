"""Paired comparisons on hand-computed numbers: the cost-of-pass reduction of one mode against
another on the same items, a paired difference of means, and the per-item oracle."""

from __future__ import annotations

import math

import pytest
from gearshift.rewards.cost_of_pass import (
    cheapest_correct,
    cost_of_pass_reduction,
    oracle_routing_accuracy,
    paired_cost_of_pass_reduction,
    paired_mean_difference,
)

ORDER = ("instant", "reasoning", "agentic")


def test_reduction_and_its_paired_interval_by_hand():
    # Items x and y, both answered in both modes. Adaptive costs 1 on each; forced 2 on x, 4 on y.
    # Point: 1 - (2/2) / (6/2) = 2/3. Resamples: xx -> 1 - 1/2 = 0.5 (p 1/4), yy -> 1 - 1/4 = 0.75
    # (p 1/4), xy or yx -> 2/3 (p 1/2). The 95% interval is therefore [0.5, 0.75].
    result = paired_cost_of_pass_reduction([1, 1], [1, 1], [2, 4], [1, 1], samples=2000, seed=5)
    assert result.value == pytest.approx(2 / 3)
    assert (result.low, result.high) == (pytest.approx(0.5), pytest.approx(0.75))
    assert result.above_zero


def test_pairing_keeps_a_constant_ratio_exact():
    # Item costs vary a hundredfold but the adaptive mode always spends half: every paired
    # resample gives exactly 0.5, where two independent bootstraps would give a wide interval.
    forced = [0.01, 1.0, 0.1, 0.5, 0.02, 0.7]
    adaptive = [c / 2 for c in forced]
    result = paired_cost_of_pass_reduction(adaptive, [1] * 6, forced, [1] * 6, samples=500)
    assert (result.value, result.low, result.high) == (pytest.approx(0.5), pytest.approx(0.5), pytest.approx(0.5))


def test_no_correct_answer_on_either_side():
    assert cost_of_pass_reduction(math.inf, 3.0) == -math.inf  # the adaptive mode never passes
    assert cost_of_pass_reduction(2.0, math.inf) == 1.0  # only the forced mode never passes
    assert cost_of_pass_reduction(math.inf, math.inf) == -math.inf
    # Adaptive right only on item x (cost 1), forced right on both (cost 1 each): point 1 - 2/1 = -1;
    # a resample of y alone leaves the adaptive mode without a correct answer: -inf in the interval.
    result = paired_cost_of_pass_reduction([1, 1], [1, 0], [1, 1], [1, 1], samples=400, seed=1)
    assert result.value == pytest.approx(-1.0) and result.low == -math.inf and not result.above_zero


def test_paired_mean_difference_by_hand():
    # Before right on x only, after right on both: +0.5. Resamples xx -> 0, yy -> 1, xy -> 0.5.
    result = paired_mean_difference([1, 0], [1, 1], samples=2000, seed=2)
    assert result.value == pytest.approx(0.5)
    assert (result.low, result.high) == (0.0, 1.0)


def test_mismatched_or_bad_input_is_refused():
    with pytest.raises(ValueError, match="same items"):
        paired_cost_of_pass_reduction([1], [1], [1, 2], [1, 1])
    with pytest.raises(ValueError, match="non-negative"):
        paired_mean_difference([1, -1], [1, 1])
    with pytest.raises(ValueError, match="same items"):
        paired_mean_difference([], [])


def test_cheapest_correct_mode_is_the_oracle():
    assert cheapest_correct({"instant": (1.0, False), "reasoning": (3.0, True), "agentic": (2.0, True)}, ORDER) == "agentic"
    assert cheapest_correct({"instant": (1.0, False), "reasoning": (3.0, True), "agentic": (3.0, True)}, ORDER) == "reasoning"
    assert cheapest_correct({"instant": (1.0, False), "agentic": (5.0, False)}, ORDER) is None


def test_routing_accuracy_counts_only_items_with_an_oracle():
    accuracy, counted = oracle_routing_accuracy(["instant", "reasoning", "agentic", "agentic"], ["instant", None, "reasoning", "agentic"])
    assert (accuracy, counted) == (pytest.approx(2 / 3), 3)
    accuracy, counted = oracle_routing_accuracy(["instant"], [None])
    assert math.isnan(accuracy) and counted == 0
    with pytest.raises(ValueError):
        oracle_routing_accuracy(["instant"], [])
