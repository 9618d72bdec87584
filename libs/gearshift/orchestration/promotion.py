"""The promotion gate: a candidate is published only when, on the held-out split, its accuracy
and its cost of pass do not regress beyond the configured margins vs the published checkpoint.

Evaluation is behind a small interface (Evaluator) so the gate does not care how it is done:
the evaluation harness (gearshift.evaluation) in the loop and the Celery tasks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from gearshift.api.common.v1.common_pb2 import Checkpoint


@dataclass(frozen=True)
class EvalResult:
    """A checkpoint's figures on one suite split. cost_of_pass is +inf when nothing is correct."""

    accuracy: float
    cost_of_pass: float
    extra: dict | None = None

    def metrics(self, suite: str, split: str) -> dict[str, float]:
        """As eval_metrics of the registry: plain names and suite/split-qualified names. The
        registry holds finite numbers only: an infinite cost of pass (nothing correct) is left
        out, and read back as infinite next to its accuracy (stored_result)."""
        values = {"accuracy": self.accuracy} | (self.extra or {})
        if math.isfinite(self.cost_of_pass):
            values["cost_of_pass"] = self.cost_of_pass
        return values | {f"{suite}/{split}/{name}": value for name, value in values.items()}


class Evaluator(Protocol):
    def evaluate(self, checkpoint: Checkpoint, suite: str, split: str) -> EvalResult:
        """Runs the checkpoint on a suite split."""


@dataclass(frozen=True)
class Margins:
    """How much worse than the published checkpoint a candidate may be."""

    accuracy: float = 0.0  # absolute drop, 0..1
    cost_of_pass: float = 0.05  # relative rise


@dataclass(frozen=True)
class Decision:
    """The gate's verdict and why."""

    promote: bool
    reasons: list[str]
    candidate: EvalResult
    baseline: EvalResult | None


def decide(candidate: EvalResult, baseline: EvalResult | None, margins: Margins) -> Decision:
    """Pure: compares a candidate with the published baseline (none: the first checkpoint passes
    when it answers anything correctly)."""
    if baseline is None:
        ok = candidate.accuracy > 0 or math.isfinite(candidate.cost_of_pass)
        reason = "no published checkpoint yet" if ok else "nothing correct on the held-out split"
        return Decision(ok, [reason], candidate, None)
    reasons = []
    if candidate.accuracy < baseline.accuracy - margins.accuracy:
        reasons.append(
            f"accuracy {candidate.accuracy:.3f} < published {baseline.accuracy:.3f} - margin {margins.accuracy:.3f}"
        )
    allowed = baseline.cost_of_pass * (1 + margins.cost_of_pass)
    if candidate.cost_of_pass > allowed:  # inf > finite, inf > inf is False: both unsolved is a tie
        reasons.append(
            f"cost of pass {candidate.cost_of_pass:.6g} > published {baseline.cost_of_pass:.6g} x (1 + {margins.cost_of_pass:.3f})"
        )
    if reasons:
        return Decision(False, reasons, candidate, baseline)
    return Decision(True, [
        f"accuracy {candidate.accuracy:.3f} vs {baseline.accuracy:.3f}, cost of pass {candidate.cost_of_pass:.6g} vs {baseline.cost_of_pass:.6g}"
    ], candidate, baseline)


def stored_result(checkpoint: Checkpoint, suite: str, split: str) -> EvalResult | None:
    """A result already in the registry for this suite split (the published one was evaluated
    when it was promoted), so the baseline is not re-run on every round."""
    metrics = checkpoint.eval_metrics
    accuracy = metrics.get(f"{suite}/{split}/accuracy")
    if accuracy is None:
        return None
    return EvalResult(accuracy, metrics.get(f"{suite}/{split}/cost_of_pass", math.inf))
