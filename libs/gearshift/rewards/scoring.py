"""Scoring a group of rollouts of one query: verdicts -> formats -> the chosen reward.

The reward service, evaluation and training all score through here, so one rollout gets the
same reward wherever it is scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gearshift.api.common.v1.common_pb2 import Mode, Reward, RoutingStrategy, Trajectory, Turn
from gearshift.protocol import native
from gearshift.protocol.sr2am import plan_block
from gearshift.rewards import formulas, verifiers
from gearshift.rewards.formats import check_trajectory_format, final_answer
from gearshift.rewards.structure import check_structure
from gearshift.settings import RewardSettings

CORRECTNESS, APO, SR2AM = "correctness", "apo", "sr2am"
KINDS = (CORRECTNESS, APO, SR2AM)


@dataclass(frozen=True)
class GroupScore:
    """Rewards in rollout order, and APO's p (None without forced-instant rollouts)."""

    rewards: list[Reward]
    forced_instant_success_rate: float | None


def resolve_verifier(verifier: str | None, reference: str) -> str:
    """The named verifier, or the one the reference calls for when none is named."""
    return verifier or verifiers.auto_verifier(reference)


def verify(answer: str, reference: str, verifier: str, config: RewardSettings) -> bool:
    """Runs one local verifier (the judge needs the network: see gearshift.rewards.judge)."""
    if not answer.strip():
        return False
    if verifier == verifiers.MATH:
        return verifiers.math_match(answer, reference, config.math_max_chars)
    if verifier == verifiers.EXACT:
        return verifiers.exact_match(answer, reference)
    if verifier == verifiers.PHRASE:
        return verifiers.phrase_match(answer, reference)
    if verifier == verifiers.F1:
        return verifiers.f1_match(answer, reference, config.f1_threshold)
    if verifier == verifiers.CHOICE:
        return verifiers.choice_match(answer, reference)
    if verifier == verifiers.NUMERIC:
        return verifiers.numeric_match(answer, reference, config.numeric_rel_tol, config.numeric_abs_tol)
    raise ValueError(f"unknown local verifier {verifier!r}")


def structure_of(rollout: Trajectory, format_valid: bool) -> bool:
    """SR2AM's structure term: the plan blocks of the regulated agentic turns (a native
    trajectory's are its recorded decisions and plans, written as the text protocol writes them);
    a trajectory without any (instant, reasoning) is judged by its mode's format instead."""
    if any(turn.plan_decision for turn in rollout.turns):
        return bool(check_structure(native_plan_blocks(rollout.turns) if native.is_native(rollout) else rollout.turns))
    return format_valid


def native_plan_blocks(turns: Sequence[Turn]) -> list[Turn]:
    """Native turns as turns whose output is their SR2AM block (sr2am.plan_block), for the checker."""
    return [Turn(plan_decision=turn.plan_decision, output=plan_block(turn.plan_decision, turn.plan, first_turn=True)[0])
            if turn.plan_decision else Turn() for turn in turns]


def is_forced_instant(rollout: Trajectory) -> bool:
    """A rollout APO forced into instant mode (prefix injection)."""
    return (
        rollout.routing_strategy == RoutingStrategy.ROUTING_STRATEGY_FORCED
        and rollout.requested_mode == Mode.MODE_INSTANT
    )


def score_group(
    rollouts: Sequence[Trajectory],
    verdicts: Sequence[bool],
    kind: str,
    verifier: str,
    config: RewardSettings,
) -> GroupScore:
    """Rewards for a group whose answers were already verified (verdicts[i] for rollouts[i])."""
    if len(rollouts) != len(verdicts):
        raise ValueError("one verdict per rollout")
    if kind not in KINDS:
        raise ValueError(f"unknown reward kind {kind!r}")
    p = formulas.success_rate(v for r, v in zip(rollouts, verdicts) if is_forced_instant(r))
    rewards = []
    for rollout, correct in zip(rollouts, verdicts):
        format_valid = bool(check_trajectory_format(rollout))
        if kind == APO:
            r_adaptive = formulas.adaptive_factor(
                p, rollout.mode, rollout.routing_strategy == RoutingStrategy.ROUTING_STRATEGY_FORCED,
                config.apo_alpha, config.apo_tau,
            )
            value = formulas.apo_reward(correct, format_valid, r_adaptive)
            components = {"r_acc": float(correct), "r_format": float(format_valid), "r_adaptive": r_adaptive}
        elif kind == SR2AM:
            structure_valid = structure_of(rollout, format_valid)
            extractable = bool(final_answer(rollout))
            value = formulas.sr2am_reward(correct, structure_valid, extractable)
            components = {"r_acc": float(correct), "r_structure": float(structure_valid), "r_extractable": float(extractable)}
        else:
            value = formulas.correctness_reward(correct)
            components = {"r_acc": value}
        rewards.append(
            Reward(value=value, correct=correct, format_valid=format_valid, kind=kind, verifier=verifier, components=components)
        )
    return GroupScore(rewards, p)


def score_rollouts(
    rollouts: Sequence[Trajectory], reference: str, kind: str, config: RewardSettings, verifier: str | None = None
) -> GroupScore:
    """Verifies and scores a group in this thread with a local verifier (evaluation, training)."""
    name = resolve_verifier(verifier, reference)
    verdicts = [verify(final_answer(r), reference, name, config) for r in rollouts]
    return score_group(rollouts, verdicts, kind, name, config)


def apo_rewards(trajectories: Sequence[Trajectory], config: RewardSettings) -> dict[str, float]:
    """The APO reward of each already-graded trajectory (id -> reward), scoring each item's
    trajectories as one group, so p is the item's forced-instant success rate among them."""
    groups: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        groups.setdefault(trajectory.labels.get("item_id", trajectory.id), []).append(trajectory)
    rewards = {}
    for group in groups.values():
        scored = score_group(group, [t.reward.correct for t in group], APO, group[0].reward.verifier, config)
        rewards.update({t.id: reward.value for t, reward in zip(group, scored.rewards)})
    return rewards
