"""Cost of pass (A^2FM): total cost / correct answers, with a percentile bootstrap interval.

Equivalently the expected cost of one attempt divided by the probability that an attempt is
correct (docs/protocol.md, section 7). With no correct answer it is +inf.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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
