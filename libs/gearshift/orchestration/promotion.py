"""The promotion gate: a candidate is published only when, on the held-out split and in every
gated mode (the model's own routing, and the learned router where one is published), the
interval of its difference to the published checkpoint says it is not worse beyond the margins:

- accuracy: the lower end of the 95 % interval of (candidate - published) is at least -margin;
- cost of pass: the upper end of the interval of (candidate / published - 1) is at most +margin;
- with require_improvement (a round meant to move a family), the accuracy interval's lower end
  is above 0 instead: an improvement, not merely no loss.

The intervals come from a paired item-level bootstrap over the items both were evaluated on.
A candidate that answers nothing correctly is refused, published checkpoint or not.

Evaluation is behind a small interface (Evaluator) so the gate does not care how it is done:
the evaluation harness (gearshift.orchestration.evaluators) in the loop and the Celery tasks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gearshift.api.common.v1.common_pb2 import Checkpoint

CONFIDENCE = 0.95
BOOTSTRAP_SAMPLES = 2000


@dataclass(frozen=True)
class ItemOutcome:
    """One item's attempts in one mode: what they cost and how many were right."""

    cost_usd: float
    correct: int
    attempts: int


@dataclass(frozen=True)
class EvalResult:
    """A checkpoint's figures in one mode on one suite split, and the per-item outcomes they
    came from. cost_of_pass is +inf when nothing is correct."""

    accuracy: float
    cost_of_pass: float
    outcomes: dict[str, ItemOutcome] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    @classmethod
    def of(cls, outcomes: dict[str, ItemOutcome], extra: dict | None = None) -> EvalResult:
        correct, attempts = sum(o.correct for o in outcomes.values()), sum(o.attempts for o in outcomes.values())
        cost = sum(o.cost_usd for o in outcomes.values())
        return cls(correct / attempts if attempts else 0.0, cost / correct if correct else math.inf, outcomes, extra or {})

    @property
    def solves_anything(self) -> bool:
        return self.accuracy > 0


def metrics(results: dict[str, EvalResult], suite: str, split: str) -> dict[str, float]:
    """The registry's eval_metrics of a gate evaluation: per mode, qualified by suite and split
    ("facts/test/auto/accuracy"), finite numbers only (an infinite cost of pass is left out)."""
    values = {}
    for mode, result in results.items():
        figures = {"accuracy": result.accuracy} | ({"cost_of_pass": result.cost_of_pass} if math.isfinite(result.cost_of_pass) else {})
        values |= {f"{suite}/{split}/{mode}/{name}": value for name, value in (figures | result.extra).items()
                   if isinstance(value, int | float) and math.isfinite(value)}
    return values


class Evaluator(Protocol):
    def evaluate(self, checkpoint: Checkpoint) -> dict[str, EvalResult]:
        """Runs the checkpoint on the gate's suite split; one result per gated mode."""


@dataclass(frozen=True)
class Margins:
    """How much worse than the published checkpoint a candidate may be."""

    accuracy: float = 0.0  # absolute drop, 0..1
    cost_of_pass: float = 0.05  # relative rise
    require_improvement: bool = False  # the accuracy interval must lie above 0


@dataclass(frozen=True)
class Decision:
    """The gate's verdict and why, mode by mode."""

    promote: bool
    reasons: list[str]
    candidate: dict[str, EvalResult]
    baseline: dict[str, EvalResult] | None


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


def paired_intervals(candidate: EvalResult, baseline: EvalResult, samples: int = BOOTSTRAP_SAMPLES,
                     seed: int = 0) -> tuple[Interval, Interval]:
    """95 % intervals of (accuracy difference, relative cost-of-pass change) from resampling
    the items both were evaluated on. In a resample where only the candidate answers nothing
    the change is +inf, where only the published one does, -1; where neither does, 0."""
    items = sorted(set(candidate.outcomes) & set(baseline.outcomes))
    if not items:
        raise ValueError("the candidate and the published checkpoint share no evaluated item")
    picks = np.random.default_rng(seed).integers(0, len(items), size=(samples, len(items)))

    def resampled(result: EvalResult) -> np.ndarray:
        """[3, samples]: each resample's total cost, correct attempts and attempts."""
        table = np.array([[o.cost_usd, o.correct, o.attempts] for o in (result.outcomes[i] for i in items)], dtype=float)
        return table[picks].sum(axis=1).T

    (cost_c, right_c, tries_c), (cost_b, right_b, tries_b) = resampled(candidate), resampled(baseline)
    accuracy = right_c / tries_c - right_b / tries_b
    with np.errstate(divide="ignore", invalid="ignore"):
        change = (cost_c / right_c) / (cost_b / right_b) - 1
    change = np.where(right_c == 0, np.where(right_b == 0, 0.0, np.inf), np.where(right_b == 0, -1.0, change))
    tail = (1 - CONFIDENCE) / 2 * 100
    return (Interval(float(np.percentile(accuracy, tail)), float(np.percentile(accuracy, 100 - tail))),
            Interval(float(np.percentile(change, tail)), float(np.percentile(change, 100 - tail))))


def decide(candidate: dict[str, EvalResult], baseline: dict[str, EvalResult] | None, margins: Margins) -> Decision:
    """Pure: the candidate passes when, in every gated mode, it answers something correctly and
    (with a published checkpoint) its intervals stay within the margins."""
    reasons, promote = [], True
    for mode, result in candidate.items():
        if not result.solves_anything:
            other = baseline and baseline.get(mode)
            reasons.append(f"{mode}: the candidate answers nothing correctly"
                           + (" (nor does the published checkpoint)" if other is not None and not other.solves_anything else ""))
            promote = False
            continue
        if baseline is None or mode not in baseline:
            reasons.append(f"{mode}: accuracy {result.accuracy:.3f}, no published checkpoint to compare with")
            continue
        accuracy, cost = paired_intervals(result, baseline[mode])
        accurate = accuracy.low > 0 if margins.require_improvement else accuracy.low >= -margins.accuracy
        ok = accurate and cost.high <= margins.cost_of_pass
        promote &= ok
        needed = "must lie above 0" if margins.require_improvement else f"margin -{margins.accuracy:.3f}"
        reasons.append(
            f"{mode}: accuracy {result.accuracy:.3f} vs {baseline[mode].accuracy:.3f} (difference 95% CI "
            f"{accuracy.low:+.3f} .. {accuracy.high:+.3f}, {needed}); cost of pass "
            f"{result.cost_of_pass:.6g} vs {baseline[mode].cost_of_pass:.6g} (change CI {cost.low:+.1%} .. {cost.high:+.1%}, "
            f"margin +{margins.cost_of_pass:.0%}){'' if ok else ': worse beyond the margin'}"
        )
    return Decision(promote, reasons, candidate, baseline)
