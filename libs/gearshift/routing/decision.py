"""The cost-aware decision: the mode that keeps the cost of pass over all queries lowest.

Cost of pass over a stream of queries is total cost / total passes (docs/protocol.md, section
7). Picking, per query, the lowest cost / P(correct) does not minimise that ratio: it divides by
probabilities near zero and pays for the dearest mode on queries no mode is likely to answer.
The ratio is minimised by picking, per query, the lowest expected cost - pass value x
P(correct), where the pass value is the lowest cost of pass reachable over such queries
(Dinkelbach, 1967): a dearer mode is worth its price when the passes it adds are worth more than
it costs. The router learns its pass value from its training queries (`pass_value`); without
one (an artefact older than format 3) the per-query cost of pass decides.

Only modes whose predicted accuracy reaches the floor compete, so a cheap mode that is seldom
right cannot displace a reliable one; when none reaches it, every mode competes. Ties go to the
cheaper mode.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Scores this close (relative) count as a tie: float noise must not pick a dearer mode.
TIE_TOLERANCE = 1e-9
# Dinkelbach's iteration reaches the optimum in a few rounds; this only bounds a pathological case.
MAX_PASS_VALUE_ROUNDS = 100


@dataclass(frozen=True)
class ModeEstimate:
    """What the router believes about one mode for one query."""

    mode: int
    probability: float
    expected_cost_usd: float

    @property
    def cost_of_pass_usd(self) -> float:
        return self.expected_cost_usd / self.probability if self.probability > 0 else math.inf

    def net_cost_usd(self, pass_value_usd: float) -> float:
        """Expected cost of one attempt less the worth of the pass it is expected to bring."""
        return self.expected_cost_usd - pass_value_usd * self.probability


@dataclass(frozen=True)
class Choice:
    """The chosen mode, every mode's estimate, and whether the floor was met."""

    mode: int
    estimates: tuple[ModeEstimate, ...]
    floor_met: bool

    @property
    def chosen(self) -> ModeEstimate:
        return next(e for e in self.estimates if e.mode == self.mode)


def _close(a: float, b: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=TIE_TOLERANCE, abs_tol=0.0)


def _cheaper_first(estimate: ModeEstimate) -> tuple[float, int]:
    return (estimate.expected_cost_usd, estimate.mode)


def choose_mode(probabilities: Mapping[int, float], expected_costs: Mapping[int, float], accuracy_floor: float,
                pass_value_usd: float | None = None) -> Choice:
    """Picks a mode among those present in both mappings (see the module docstring)."""
    modes = sorted(set(probabilities) & set(expected_costs))
    if not modes:
        raise ValueError("no mode has both a probability and an expected cost")
    estimates = tuple(ModeEstimate(m, float(probabilities[m]), float(expected_costs[m])) for m in modes)
    reliable = [e for e in estimates if e.probability >= accuracy_floor]
    competing = reliable or estimates
    if pass_value_usd is None:
        scores = [e.cost_of_pass_usd for e in competing]
    else:
        scores = [e.net_cost_usd(pass_value_usd) for e in competing]
    best = min(scores)
    tied = [e for e, score in zip(competing, scores) if _close(score, best)]
    return Choice(min(tied, key=_cheaper_first).mode, estimates, bool(reliable))


def pass_value(queries: Sequence[tuple[Mapping[int, float], Mapping[int, float]]], accuracy_floor: float) -> float | None:
    """The lowest expected cost of pass over these queries (probabilities, expected costs per
    mode) that per-query choices reach, by Dinkelbach's iteration: choose by the current value,
    then value = expected cost / expected passes of those choices, until it stops falling.
    None when no choice is expected to pass at all."""
    value = None  # the first round chooses by per-query cost of pass
    for _ in range(MAX_PASS_VALUE_ROUNDS):
        chosen = [choose_mode(p, c, accuracy_floor, value).chosen for p, c in queries]
        passes = sum(e.probability for e in chosen)
        if passes <= 0:
            return value
        ratio = sum(e.expected_cost_usd for e in chosen) / passes
        if value is not None and ratio >= value * (1 - TIE_TOLERANCE):
            break
        value = ratio
    return value
