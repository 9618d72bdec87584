"""The cost-of-pass decision on hand-computed cases, and the pass value against brute force."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from gearshift.routing.decision import ModeEstimate, choose_mode, pass_value

I, R, A = 1, 2, 3  # instant, reasoning, agentic
COSTS = {I: 1.0, R: 4.0, A: 10.0}


def test_lowest_expected_cost_of_pass_wins():
    # cost of pass: I 1/0.2 = 5, R 4/0.9 = 4.44, A 10/0.95 = 10.5
    choice = choose_mode({I: 0.2, R: 0.9, A: 0.95}, COSTS, accuracy_floor=0.0)
    assert choice.mode == R and choice.floor_met
    by_mode = {e.mode: e for e in choice.estimates}
    assert by_mode[I].cost_of_pass_usd == pytest.approx(5.0)
    assert by_mode[R].cost_of_pass_usd == pytest.approx(4 / 0.9)
    assert by_mode[A].cost_of_pass_usd == pytest.approx(10 / 0.95)


def test_the_floor_removes_cheap_but_unreliable_modes():
    probabilities = {I: 0.3, R: 0.5, A: 0.9}  # cost of pass 3.33, 8, 11.1
    assert choose_mode(probabilities, COSTS, accuracy_floor=0.0).mode == I
    assert choose_mode(probabilities, COSTS, accuracy_floor=0.4).mode == R
    assert choose_mode(probabilities, COSTS, accuracy_floor=0.6).mode == A
    assert choose_mode(probabilities, COSTS, accuracy_floor=0.5).mode == R  # the floor is inclusive


def test_with_no_mode_above_the_floor_every_mode_competes_on_cost_of_pass():
    # cost of pass: I 1/0.1 = 10, R 4/0.3 = 13.3, A 10/0.2 = 50: the most likely mode is not worth its price
    choice = choose_mode({I: 0.1, R: 0.3, A: 0.2}, COSTS, accuracy_floor=0.9)
    assert choice.mode == I and not choice.floor_met
    # ... unless it is likely enough to pay for itself: R 4/0.45 = 8.9 < I 10
    assert choose_mode({I: 0.1, R: 0.45, A: 0.2}, COSTS, accuracy_floor=0.9).mode == R


def test_ties_go_to_the_cheaper_mode():
    # I: 1/0.25 = 4, R: 4/1.0 = 4 -> equal cost of pass, instant is cheaper per attempt
    assert choose_mode({I: 0.25, R: 1.0, A: 0.1}, COSTS, accuracy_floor=0.0).mode == I
    # nothing can be right below the floor either: every cost of pass is infinite, the cheapest wins
    assert choose_mode({I: 0.0, R: 0.0, A: 0.0}, COSTS, accuracy_floor=0.5).mode == I
    # float noise is a tie too: 0.1 * 3 is not exactly 0.3
    assert choose_mode({R: 0.1 * 3, A: 0.75}, {R: 1.0, A: 2.5}, accuracy_floor=0.0).mode == R


def test_zero_probability_means_infinite_cost_of_pass():
    assert ModeEstimate(I, 0.0, 1.0).cost_of_pass_usd == math.inf
    assert choose_mode({I: 0.0, A: 0.01}, COSTS, accuracy_floor=0.0).mode == A


def test_only_modes_with_both_figures_compete():
    assert choose_mode({I: 0.99, A: 0.5}, {A: 1.0, R: 0.1}, accuracy_floor=0.0).mode == A
    with pytest.raises(ValueError):
        choose_mode({I: 0.9}, {A: 1.0}, accuracy_floor=0.0)


def test_with_a_pass_value_a_query_nobody_answers_goes_to_the_cheapest_mode():
    # per query, A's 1% chance beats I's none (above); worth 20 a pass, it adds 0.2 for 10
    assert choose_mode({I: 0.0, R: 0.0, A: 0.01}, COSTS, accuracy_floor=0.0, pass_value_usd=20.0).mode == I


def test_with_a_pass_value_a_dearer_mode_is_worth_the_passes_it_adds():
    # net of passes worth 20: I 1 - 2 = -1, R 4 - 6 = -2, A 10 - 4 = 6; per query I wins (10 < 13.3)
    probabilities = {I: 0.1, R: 0.3, A: 0.2}
    assert choose_mode(probabilities, COSTS, accuracy_floor=0.9, pass_value_usd=20.0).mode == R
    assert choose_mode(probabilities, COSTS, accuracy_floor=0.9).mode == I
    # the floor still rules out an unreliable mode when a reliable one exists
    assert choose_mode({I: 0.3, R: 0.5, A: 0.9}, COSTS, accuracy_floor=0.6, pass_value_usd=100.0).mode == A


def test_the_pass_value_by_hand():
    # per query: q1 instant (1.1 < 10), q2 agentic (100 < inf): 11 for 1.0 passes. At 11 a pass,
    # q2 goes to instant too: 2 for 0.9 passes, which nothing beats.
    queries = [({I: 0.9, A: 1.0}, {I: 1.0, A: 10.0}), ({I: 0.0, A: 0.1}, {I: 1.0, A: 10.0})]
    assert pass_value(queries, accuracy_floor=0.0) == pytest.approx(2 / 0.9)
    assert pass_value([({I: 0.0, A: 0.0}, {I: 1.0, A: 10.0})], accuracy_floor=0.0) is None  # nothing ever passes


@pytest.mark.parametrize("seed", range(20))
def test_the_pass_value_is_the_lowest_cost_of_pass_any_choice_reaches(seed):
    rng = random.Random(seed)
    floor = rng.choice([0.0, 0.5])
    queries = [({m: rng.random() ** 2 for m in COSTS}, {m: c * rng.uniform(0.5, 2) for m, c in COSTS.items()}) for _ in range(6)]

    def allowed(probabilities):
        reliable = [m for m, p in probabilities.items() if p >= floor]
        return reliable or list(probabilities)

    best = min(
        sum(c[m] for (_, c), m in zip(queries, picks)) / sum(p[m] for (p, _), m in zip(queries, picks))
        for picks in itertools.product(*(allowed(p) for p, _ in queries))
    )
    value = pass_value(queries, floor)
    assert value == pytest.approx(best, rel=1e-9)
    chosen = [choose_mode(p, c, floor, value).chosen for p, c in queries]
    assert sum(e.expected_cost_usd for e in chosen) / sum(e.probability for e in chosen) == pytest.approx(best, rel=1e-9)
