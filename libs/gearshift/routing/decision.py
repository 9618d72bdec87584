"""The cost-aware decision: the mode with the lowest expected cost of pass.

expected cost of pass(mode) = expected cost of one attempt in that mode / P(correct | query, mode)
(docs/protocol.md, sections 7 and 8, per query). Only modes whose predicted accuracy reaches the floor
compete, so a cheap mode that is seldom right cannot displace a reliable one; when none reaches it,
every mode competes: paying for a dearer mode that is only a little more likely to be right is
what cost of pass counts against. Ties go to the cheaper mode.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

# Cost-of-pass values this close (relative) count as a tie: float noise must not pick a
# dearer mode.
TIE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class ModeEstimate:
    """What the router believes about one mode for one query."""

    mode: int
    probability: float
    expected_cost_usd: float

    @property
    def cost_of_pass_usd(self) -> float:
        return self.expected_cost_usd / self.probability if self.probability > 0 else math.inf


@dataclass(frozen=True)
class Choice:
    """The chosen mode, every mode's estimate, and whether the floor was met."""

    mode: int
    estimates: tuple[ModeEstimate, ...]
    floor_met: bool


def _close(a: float, b: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=TIE_TOLERANCE, abs_tol=0.0)


def _cheaper_first(estimate: ModeEstimate) -> tuple[float, int]:
    return (estimate.expected_cost_usd, estimate.mode)


def choose_mode(probabilities: Mapping[int, float], expected_costs: Mapping[int, float], accuracy_floor: float) -> Choice:
    """Picks a mode among those present in both mappings (see the module docstring)."""
    modes = sorted(set(probabilities) & set(expected_costs))
    if not modes:
        raise ValueError("no mode has both a probability and an expected cost")
    estimates = tuple(ModeEstimate(m, float(probabilities[m]), float(expected_costs[m])) for m in modes)
    reliable = [e for e in estimates if e.probability >= accuracy_floor]
    competing = reliable or estimates
    best = min(e.cost_of_pass_usd for e in competing)
    tied = [e for e in competing if _close(e.cost_of_pass_usd, best)]
    return Choice(min(tied, key=_cheaper_first).mode, estimates, bool(reliable))
