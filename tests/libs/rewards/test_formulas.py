"""Reward formulas: a worked APO example by hand, the SR2AM tiers, and property tests that every
reward stays in its documented range."""

from __future__ import annotations

import pytest
from gearshift.rewards import formulas
from gearshift.rewards.scoring import APO, CORRECTNESS, KINDS, SR2AM, score_group, score_rollouts
from gearshift.rewards.verifiers import token_f1
from gearshift.settings import RewardSettings
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.libs.rewards.trajectories import AGENTIC, INSTANT, REASONING, SR2AM_TURNS, rollout

CONFIG = RewardSettings(apo_alpha=2.0, apo_tau=0.5)
SR2AM_VALUES = {0.0, 0.1, 0.2, 0.8, 1.0}


def apo_group():
    """Ten rollouts of "What is 17*23?" (reference 391): three forced instant (two right), one
    forced reasoning and one forced agentic, five free ones that routed themselves."""
    return [
        rollout(INSTANT, "391", forced=True),
        rollout(INSTANT, "391", forced=True),
        rollout(INSTANT, "390", forced=True),
        rollout(REASONING, "391", forced=True),
        rollout(AGENTIC, "391", forced=True),
        rollout(REASONING, "391"),
        rollout(AGENTIC, "391"),
        rollout(INSTANT, "391"),
        rollout(REASONING, "391", well_formed=False),
        rollout(AGENTIC, "390"),
    ]


def test_worked_apo_example():
    # By hand: p = 2 correct / 3 forced-instant = 2/3 >= tau = 0.5, so the query is easy and a
    # free rollout that chose reasoning or agentic mode gets r_adaptive = 1 - (2/3)**2 = 5/9.
    scored = score_rollouts(apo_group(), "391", APO, CONFIG)
    assert scored.forced_instant_success_rate == pytest.approx(2 / 3)
    penalty = 1 - (2 / 3) ** 2
    assert penalty == pytest.approx(5 / 9)
    expected = [
        1.0, 1.0, 0.0,  # forced instant: right, right, wrong
        1.0, 1.0,  # forced reasoning/agentic: they did not choose their mode, no penalty
        5 / 9, 5 / 9,  # free, chose reasoning / agentic on an easy query
        1.0,  # free, chose instant
        0.0,  # free reasoning, right answer, broken format: r_format = 0
        0.0,  # free agentic, wrong: r_acc = 0
    ]
    assert [r.value for r in scored.rewards] == pytest.approx(expected)
    free_reasoning = scored.rewards[5]
    assert dict(free_reasoning.components) == pytest.approx({"r_acc": 1.0, "r_format": 1.0, "r_adaptive": 5 / 9})
    assert free_reasoning.verifier == "math" and free_reasoning.kind == "apo"
    assert scored.rewards[8].components["r_format"] == 0.0 and scored.rewards[8].correct


def test_apo_on_a_hard_query_does_not_penalise_any_mode():
    # Same group, tau = 0.7: p = 2/3 < tau, the query is hard, r_adaptive = 1 everywhere.
    scored = score_rollouts(apo_group(), "391", APO, CONFIG.model_copy(update={"apo_tau": 0.7}))
    assert [r.value for r in scored.rewards] == [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]


def test_apo_without_forced_instant_rollouts():
    scored = score_rollouts([rollout(REASONING), rollout(AGENTIC)], "391", APO, CONFIG)
    assert scored.forced_instant_success_rate is None
    assert [r.value for r in scored.rewards] == [1.0, 1.0]


@pytest.mark.parametrize(
    ("correct", "structured", "extractable", "value"),
    [
        (True, True, True, 1.0),
        (True, False, True, 0.8),
        (False, True, True, 0.2),
        (False, True, False, 0.2),
        (False, False, True, 0.1),
        (False, False, False, 0.0),
    ],
)
def test_sr2am_tiers(correct, structured, extractable, value):
    assert formulas.sr2am_reward(correct, structured, extractable) == value


def test_sr2am_tiers_on_trajectories():
    structured = list(SR2AM_TURNS)
    group = [
        rollout(AGENTIC, "391", outputs=tuple(structured)),  # right, structured
        rollout(AGENTIC, "391"),  # right, A^2FM format but no plan blocks
        rollout(AGENTIC, "390", outputs=(structured[0], "Plan: None\n<answer>390</answer>")),  # wrong, structured
        rollout(AGENTIC, "390"),  # wrong, an answer to extract
        rollout(AGENTIC, "", outputs=("I give up.",)),  # nothing
    ]
    scored = score_rollouts(group, "391", SR2AM, CONFIG)
    assert [r.value for r in scored.rewards] == [1.0, 0.8, 0.2, 0.1, 0.0]
    assert scored.rewards[0].components["r_structure"] == 1.0 and scored.rewards[1].components["r_structure"] == 0.0


def test_plain_correctness():
    scored = score_rollouts([rollout(INSTANT, "391"), rollout(INSTANT, "17*23 = 390")], "391", CORRECTNESS, CONFIG)
    assert [(r.value, r.correct, r.kind) for r in scored.rewards] == [(1.0, True, "correctness"), (0.0, False, "correctness")]


unit = st.floats(0, 1, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(p=st.none() | unit, mode=st.sampled_from([INSTANT, REASONING, AGENTIC]), forced=st.booleans(),
       alpha=st.floats(0, 10, allow_nan=False), tau=unit, correct=st.booleans(), formatted=st.booleans())
def test_apo_stays_in_0_1(p, mode, forced, alpha, tau, correct, formatted):
    r_adaptive = formulas.adaptive_factor(p, mode, forced, alpha, tau)
    assert 0.0 <= r_adaptive <= 1.0
    value = formulas.apo_reward(correct, formatted, r_adaptive)
    assert 0.0 <= value <= 1.0
    assert value <= float(correct) and value <= float(formatted)


@settings(max_examples=50, deadline=None)
@given(correct=st.booleans(), structured=st.booleans(), extractable=st.booleans())
def test_sr2am_takes_only_its_five_values(correct, structured, extractable):
    assert formulas.sr2am_reward(correct, structured, extractable) in SR2AM_VALUES
    assert formulas.correctness_reward(correct) in (0.0, 1.0)


members = st.tuples(
    st.sampled_from([INSTANT, REASONING, AGENTIC]),
    st.booleans(),  # forced
    st.booleans(),  # well formed
    st.booleans(),  # correct
)


@settings(max_examples=60, deadline=None)
@given(group=st.lists(members, min_size=1, max_size=12), kind=st.sampled_from(KINDS),
       alpha=st.floats(0, 8, allow_nan=False), tau=unit)
def test_group_rewards_stay_in_range(group, kind, alpha, tau):
    rollouts = [rollout(mode, forced=forced, well_formed=formed) for mode, forced, formed, _ in group]
    verdicts = [correct for *_, correct in group]
    scored = score_group(rollouts, verdicts, kind, "exact", CONFIG.model_copy(update={"apo_alpha": alpha, "apo_tau": tau}))
    p = scored.forced_instant_success_rate
    assert p is None or 0.0 <= p <= 1.0
    for reward, correct in zip(scored.rewards, verdicts):
        assert reward.correct is correct
        if kind == SR2AM:
            assert reward.value in SR2AM_VALUES
        else:
            assert 0.0 <= reward.value <= 1.0
            assert reward.value <= float(correct)


@settings(max_examples=200, deadline=None)
@given(answer=st.text(max_size=40), reference=st.text(max_size=40))
def test_token_f1_in_0_1(answer, reference):
    assert 0.0 <= token_f1(answer, reference) <= 1.0
