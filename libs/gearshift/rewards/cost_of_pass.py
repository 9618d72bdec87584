"""Cost of pass (A^2FM): total cost / correct answers, with a percentile bootstrap interval.

Equivalently the expected cost of one attempt divided by the probability that an attempt is
correct (docs/protocol.md, section 7). With no correct answer it is +inf.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

# Resamples drawn per numpy call, so memory stays bounded for large sets.
_CHUNK_ELEMENTS = 4_000_000


@dataclass(frozen=True)
class CostOfPass:
    """The metric, its confidence interval and the counts it came from."""

    cost_of_pass_usd: float
    ci_low_usd: float
    ci_high_usd: float
    attempts: int
    correct: int
    total_cost_usd: float


def cost_of_pass(total_cost: float, correct: int) -> float:
    """Total cost / correct answers; +inf when none is correct."""
    return total_cost / correct if correct else math.inf


def compute_cost_of_pass(
    costs: Sequence[float], correct: Sequence[bool], samples: int, confidence: float = 0.95, seed: int = 0,
    items: Sequence[str] | None = None,
) -> CostOfPass:
    """The metric over a set of attempts, with a seeded percentile bootstrap interval. The
    bootstrap resamples items with replacement (items[i] is attempt i's item; none: each attempt
    its own), so several attempts of one item move together and the interval is not too narrow.
    A resample without a correct answer counts +inf."""
    if len(costs) != len(correct) or not costs or (items is not None and len(items) != len(costs)):
        raise ValueError("need one verdict (and item) per cost, and at least one attempt")
    if not 0 < confidence < 1:
        raise ValueError("confidence must lie in (0, 1)")
    if samples < 1:
        raise ValueError("samples must be positive")
    cost = np.asarray(costs, dtype=np.float64)
    passed = np.asarray(correct, dtype=bool)
    if not np.all(np.isfinite(cost)) or np.any(cost < 0):
        raise ValueError("costs must be finite and non-negative")
    total, n_correct = float(cost.sum()), int(passed.sum())
    if items is not None:  # one row per item: its total cost and its number of correct attempts
        keys, index = np.unique(np.asarray(items, dtype=object).astype(str), return_inverse=True)
        cost, passed = np.bincount(index, weights=cost, minlength=len(keys)), np.bincount(index, weights=passed, minlength=len(keys))

    rng = np.random.default_rng(seed)
    n = len(cost)
    rows = max(1, _CHUNK_ELEMENTS // n)
    resampled = np.empty(samples)
    for start in range(0, samples, rows):
        count = min(rows, samples - start)
        picks = rng.integers(0, n, size=(count, n))
        totals, hits = cost[picks].sum(axis=1), passed[picks].sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            resampled[start : start + count] = np.where(hits > 0, totals / np.maximum(hits, 1), np.inf)
    resampled.sort()
    tail = (1 - confidence) / 2
    low = resampled[min(samples - 1, math.floor(tail * samples))]
    high = resampled[max(0, math.ceil((1 - tail) * samples) - 1)]
    return CostOfPass(cost_of_pass(total, n_correct), float(low), float(high), len(costs), n_correct, total)


# Paired comparisons: the same items under two modes (or two models). Resampling the items once
# and computing both sides on that resample keeps their correlation, so the interval of a
# difference is the interval of the difference and not of two independent noises.


@dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile bootstrap interval."""

    value: float
    low: float
    high: float

    @property
    def above_zero(self) -> bool:
        return self.low > 0


def _percentile_interval(resampled: np.ndarray, confidence: float) -> tuple[float, float]:
    resampled = np.sort(resampled)
    samples = len(resampled)
    tail = (1 - confidence) / 2
    return float(resampled[min(samples - 1, math.floor(tail * samples))]), float(resampled[max(0, math.ceil((1 - tail) * samples) - 1)])


def _item_resamples(n: int, samples: int, seed: int):
    """Index arrays [rows, n] of items drawn with replacement, `samples` rows in all, in chunks."""
    rng = np.random.default_rng(seed)
    rows = max(1, _CHUNK_ELEMENTS // n)
    for start in range(0, samples, rows):
        yield rng.integers(0, n, size=(min(rows, samples - start), n))


def _checked_pairs(*columns: Sequence[float], samples: int, confidence: float) -> list[np.ndarray]:
    if not columns[0] or len({len(c) for c in columns}) != 1:
        raise ValueError("need the same items, at least one, on both sides")
    if samples < 1 or not 0 < confidence < 1:
        raise ValueError("samples must be positive and confidence in (0, 1)")
    arrays = [np.asarray(c, dtype=np.float64) for c in columns]
    if not all(np.all(np.isfinite(a)) and np.all(a >= 0) for a in arrays):
        raise ValueError("costs and correct counts must be finite and non-negative")
    return arrays


def cost_of_pass_reduction(adaptive_cop: np.ndarray | float, forced_cop: np.ndarray | float) -> np.ndarray | float:
    """1 - adaptive / forced: 0.45 means 45% cheaper per correct answer. Where the adaptive side
    has no correct answer the reduction is -inf (and also where neither has: nothing is shown to
    be saved); where only the forced side has none, the adaptive one saves everything: 1."""
    a, f = np.asarray(adaptive_cop, dtype=np.float64), np.asarray(forced_cop, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(np.isinf(a), -np.inf, np.where(np.isinf(f), 1.0, 1.0 - a / np.where(f > 0, f, np.nan)))
    out = np.where(np.isnan(out), 0.0, out)  # both free (cost 0): nothing saved
    return float(out) if out.ndim == 0 else out


def paired_cost_of_pass_reduction(
    adaptive_costs: Sequence[float], adaptive_correct: Sequence[float], forced_costs: Sequence[float], forced_correct: Sequence[float],
    samples: int = 2000, confidence: float = 0.95, seed: int = 0,
) -> Interval:
    """The cost-of-pass reduction of an adaptive mode against a forced one on the same items,
    with a paired item-level bootstrap: row i of every sequence is item i (its total cost and
    number of correct attempts in that mode); each resample draws items once and computes both
    modes' cost of pass on it."""
    a_cost, a_ok, f_cost, f_ok = _checked_pairs(adaptive_costs, adaptive_correct, forced_costs, forced_correct,
                                                samples=samples, confidence=confidence)
    point = cost_of_pass_reduction(cost_of_pass(a_cost.sum(), a_ok.sum()), cost_of_pass(f_cost.sum(), f_ok.sum()))
    chunks = []
    for picks in _item_resamples(len(a_cost), samples, seed):
        with np.errstate(divide="ignore", invalid="ignore"):
            a = np.where(a_ok[picks].sum(axis=1) > 0, a_cost[picks].sum(axis=1) / a_ok[picks].sum(axis=1), np.inf)
            f = np.where(f_ok[picks].sum(axis=1) > 0, f_cost[picks].sum(axis=1) / f_ok[picks].sum(axis=1), np.inf)
        chunks.append(cost_of_pass_reduction(a, f))
    return Interval(float(point), *_percentile_interval(np.concatenate(chunks), confidence))


def paired_mean_difference(
    before: Sequence[float], after: Sequence[float], samples: int = 2000, confidence: float = 0.95, seed: int = 0,
) -> Interval:
    """mean(after) - mean(before) over the same items (e.g. 0/1 correctness), with a paired
    item-level bootstrap interval."""
    b, a = _checked_pairs(before, after, samples=samples, confidence=confidence)
    chunks = [a[picks].mean(axis=1) - b[picks].mean(axis=1) for picks in _item_resamples(len(a), samples, seed)]
    return Interval(float(a.mean() - b.mean()), *_percentile_interval(np.concatenate(chunks), confidence))


def cheapest_correct(outcomes: Mapping[str, tuple[float, bool]], order: Sequence[str]) -> str | None:
    """The per-item oracle: among modes that were correct on the item (mode -> (cost, correct)),
    the cheapest; ties go to the mode earlier in `order`. None when no mode was correct."""
    correct = [m for m in order if m in outcomes and outcomes[m][1]]
    return min(correct, key=lambda m: (outcomes[m][0], order.index(m))) if correct else None


def oracle_routing_accuracy(chosen: Sequence[str], oracles: Sequence[str | None]) -> tuple[float, int]:
    """(share of items where the chosen mode is the oracle's, items counted): items without an
    oracle (no mode correct) are left out, since every choice is equally wrong there."""
    if len(chosen) != len(oracles):
        raise ValueError("need one oracle per choice")
    counted = [(c, o) for c, o in zip(chosen, oracles) if o is not None]
    return (sum(c == o for c, o in counted) / len(counted) if counted else math.nan), len(counted)
