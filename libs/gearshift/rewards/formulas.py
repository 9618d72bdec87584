"""The reward formulas as small pure functions (docs/protocol.md, section 6).

Ranges: correctness_reward in {0, 1}; adaptive_factor in [0, 1]; apo_reward in [0, 1];
sr2am_reward in {0, 0.1, 0.2, 0.8, 1}.
"""

from __future__ import annotations

from collections.abc import Iterable

from gearshift.api.common.v1.common_pb2 import Mode

SR2AM_CORRECT_STRUCTURED = 1.0
SR2AM_CORRECT_UNSTRUCTURED = 0.8
SR2AM_WRONG_STRUCTURED = 0.2
SR2AM_WRONG_EXTRACTABLE = 0.1


def correctness_reward(correct: bool) -> float:
    """Plain correctness: 1 when correct, else 0."""
    return 1.0 if correct else 0.0


def success_rate(verdicts: Iterable[bool]) -> float | None:
    """Share of True verdicts; None for no verdicts (APO's p over the forced-instant rollouts)."""
    verdicts = list(verdicts)
    return sum(verdicts) / len(verdicts) if verdicts else None


def adaptive_factor(p: float | None, mode: int, forced: bool, alpha: float, tau: float) -> float:
    """A^2FM r_adaptive: 1 - p**alpha when the query is easy (forced-instant success rate
    p >= tau) and the rollout chose a non-instant mode itself; 1 otherwise.

    Forced rollouts did not choose their mode (their prefix tokens are masked out of the
    loss), so they are not penalised; without forced-instant rollouts (p is None) nothing is.
    """
    if p is None or forced or mode == Mode.MODE_INSTANT or p < tau:
        return 1.0
    return 1.0 - p**alpha


def apo_reward(correct: bool, format_valid: bool, r_adaptive: float) -> float:
    """A^2FM APO: r = r_acc * r_adaptive * r_format."""
    return float(correct) * r_adaptive * float(format_valid)


def sr2am_reward(correct: bool, structure_valid: bool, answer_extractable: bool) -> float:
    """SR2AM structure-aware reward: 1.0 correct and structured, 0.8 correct only, 0.2
    structured only, 0.1 neither but an answer could be extracted, else 0."""
    if correct:
        return SR2AM_CORRECT_STRUCTURED if structure_valid else SR2AM_CORRECT_UNSTRUCTURED
    if structure_valid:
        return SR2AM_WRONG_STRUCTURED
    return SR2AM_WRONG_EXTRACTABLE if answer_extractable else 0.0
