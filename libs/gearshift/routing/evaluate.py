"""Offline evaluation of a learned router on held-out queries, by replaying stored outcomes.

For each held-out item the router picks a mode from the query alone; the stored forced
attempts of that mode on that item are what the routed policy would have spent and scored.
Compared on the same items: every forced mode, the oracle (the cheapest mode that was
correct), and model-native routing (auto) where such attempts are stored.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from gearshift.protocol.modes import NAME_OF
from gearshift.rewards.cost_of_pass import CostOfPass, compute_cost_of_pass
from gearshift.routing.dataset import CORRECT_SHARE, Attempt, QueryOutcomes
from gearshift.routing.model import RouterModel


@dataclass(frozen=True)
class PolicyResult:
    """Accuracy and cost of pass of one routing policy over the evaluated items."""

    name: str
    items: int
    accuracy: float
    cost: CostOfPass


@dataclass
class RoutingEvaluation:
    items: int  # held-out items with every mode tried
    skipped_items: int  # held-out items missing a mode's attempts
    items_with_oracle: int
    routing_accuracy: float  # chose the oracle mode, over items that have one
    chosen_correct_rate: float  # chose a mode that was correct on the item
    mode_share: dict[int, float]
    policies: dict[str, PolicyResult] = field(default_factory=dict)

    def change_vs(self, name: str) -> float:
        """Relative cost-of-pass change of learned routing against a policy (-0.45 = 45% cheaper)."""
        ours, theirs = self.policies["learned"].cost.cost_of_pass_usd, self.policies[name].cost.cost_of_pass_usd
        return ours / theirs - 1 if math.isfinite(ours) and math.isfinite(theirs) and theirs > 0 else math.nan

    def metrics(self) -> dict[str, float]:
        """Flat, finite figures for the checkpoint registry's eval_metrics."""
        out = {
            "eval_items": float(self.items),
            "eval_items_skipped": float(self.skipped_items),
            "routing_accuracy": self.routing_accuracy,
            "chosen_correct_rate": self.chosen_correct_rate,
        }
        out.update({f"learned_share_{NAME_OF[m]}": share for m, share in self.mode_share.items()})
        for name, result in self.policies.items():
            out[f"{name}_accuracy"] = result.accuracy
            out[f"{name}_cost_of_pass_usd"] = result.cost.cost_of_pass_usd
            if name != "learned":
                out[f"learned_cost_of_pass_change_vs_{name}"] = self.change_vs(name)
        return {k: float(v) for k, v in out.items() if math.isfinite(v)}

    def table(self) -> str:
        """A Markdown table of the policies."""
        lines = [
            f"routing accuracy {self.routing_accuracy:.3f} over {self.items_with_oracle} items with an oracle "
            f"({self.items} evaluated, {self.skipped_items} skipped)",
            "",
            "| policy | items | accuracy | cost of pass (USD) | 95% CI | learned vs this |",
            "|---|---|---|---|---|---|",
        ]
        for name, r in self.policies.items():
            change = "" if name == "learned" else f"{self.change_vs(name):+.1%}"
            lines.append(
                f"| {name} | {r.items} | {r.accuracy:.3f} | {r.cost.cost_of_pass_usd:.3g} | "
                f"{r.cost.ci_low_usd:.3g} - {r.cost.ci_high_usd:.3g} | {change} |"
            )
        return "\n".join(lines)


def _result(name: str, picked: list[list[Attempt]], bootstrap_samples: int) -> PolicyResult:
    attempts = [a for chosen in picked for a in chosen]
    items = [str(index) for index, chosen in enumerate(picked) for _ in chosen]
    cost = compute_cost_of_pass([a.cost_usd for a in attempts], [a.correct for a in attempts], bootstrap_samples, items=items)
    return PolicyResult(name, len(picked), cost.correct / cost.attempts, cost)


def evaluate_router(
    model: RouterModel, features: np.ndarray, items: list[QueryOutcomes], accuracy_floor: float, bootstrap_samples: int = 1_000
) -> RoutingEvaluation:
    """features[i] is the feature row of items[i]."""
    covered = [i for i, item in enumerate(items) if all(m in item.forced for m in model.modes)]
    if not covered:
        raise ValueError("no held-out item has attempts in every mode the router knows")
    chosen = [choice.mode for choice in model.choose_many(features[covered], accuracy_floor)]
    evaluated = [items[i] for i in covered]

    oracles = [item.oracle_mode() for item in evaluated]
    with_oracle = [(mode, oracle) for mode, oracle in zip(chosen, oracles) if oracle is not None]
    hits = sum(mode == oracle for mode, oracle in with_oracle)
    correct_choice = sum(item.success_rate(mode) >= CORRECT_SHARE for item, mode in zip(evaluated, chosen))
    shares = Counter(chosen)

    policies = {"learned": _result("learned", [item.forced[m] for item, m in zip(evaluated, chosen)], bootstrap_samples)}
    for mode in model.modes:
        policies[f"forced_{NAME_OF[mode]}"] = _result(f"forced_{NAME_OF[mode]}", [item.forced[mode] for item in evaluated], bootstrap_samples)
    oracle_picks = [
        item.forced[oracle if oracle is not None else min(item.forced, key=lambda m, it=item: (it.mean_cost(m), m))]
        for item, oracle in zip(evaluated, oracles)
    ]
    policies["oracle"] = _result("oracle", oracle_picks, bootstrap_samples)
    native = [item.native for item in evaluated if item.native]
    if native:
        policies["native"] = _result("native", native, bootstrap_samples)

    return RoutingEvaluation(
        items=len(evaluated),
        skipped_items=len(items) - len(evaluated),
        items_with_oracle=len(with_oracle),
        routing_accuracy=hits / len(with_oracle) if with_oracle else math.nan,
        chosen_correct_rate=correct_choice / len(evaluated),
        mode_share={m: shares[m] / len(evaluated) for m in model.modes},
        policies=policies,
    )
