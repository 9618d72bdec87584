"""Before and after: two headline runs on the same items (e.g. the base policy and the checkpoint
one APO round made from it), compared item by item with paired bootstrap intervals.

Per routed mode (auto by default): accuracy, cost of pass, and the share of non-instant choices
on the items the base answers correctly in forced instant mode (overthinking: paying for
reasoning or tools where the cheapest mode already suffices). The base's forced instant verdicts
come from the before run.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from gearshift.api.common.v1.common_pb2 import Trajectory
from gearshift.evaluation.headline_report import Outcome, item_outcomes, latest_finished
from gearshift.evaluation.report import json_safe, markdown_table, usd
from gearshift.rewards.cost_of_pass import Interval, compute_cost_of_pass, paired_cost_of_pass_reduction, paired_mean_difference


@dataclass(frozen=True)
class Side:
    """One run's figures on the compared items."""

    accuracy: float
    cost_of_pass_usd: float
    cost_of_pass_ci: tuple[float, float]
    non_instant_share_on_instant_correct: float


@dataclass
class BeforeAfter:
    before_run: str
    after_run: str
    mode: str
    items: int
    instant_correct_items: int  # items the base answers correctly in forced instant mode
    before: Side
    after: Side
    accuracy_change: Interval  # after - before, in accuracy (0.05 = 5 points)
    cost_of_pass_reduction: Interval  # 1 - after / before (0.2 = 20% cheaper per correct answer)
    non_instant_share_change: Interval | None  # after - before, on the instant-correct items


def _correct(outcome: Outcome) -> bool:
    return outcome.correct * 2 >= outcome.attempts > 0


def _side(outcomes: dict[str, Outcome], items: list[str], instant_correct: list[str], samples: int, seed: int) -> Side:
    cop = compute_cost_of_pass([outcomes[i].cost_usd for i in items], [_correct(outcomes[i]) for i in items], samples, seed=seed)
    share = sum(outcomes[i].chosen != "instant" for i in instant_correct) / len(instant_correct) if instant_correct else math.nan
    return Side(sum(_correct(outcomes[i]) for i in items) / len(items), cop.cost_of_pass_usd, (cop.ci_low_usd, cop.ci_high_usd), share)


def compare_runs(before: list[Trajectory], after: list[Trajectory], before_run: str, after_run: str, mode: str = "auto",
                 samples: int = 2000, seed: int = 0) -> BeforeAfter:
    """The paired comparison of `mode` between two runs on the items both ran in it."""
    b_all, a_all = item_outcomes(latest_finished(before)[0]), item_outcomes(latest_finished(after)[0])
    for run, outcomes in ((before_run, b_all), (after_run, a_all)):
        if mode not in outcomes:
            raise ValueError(f"run {run!r} has no finished {mode} episodes")
    if "instant" not in b_all:
        raise ValueError(f"run {before_run!r} has no forced instant episodes: they say which items the base answers directly")
    b, a = b_all[mode], a_all[mode]
    items = sorted(set(b) & set(a))
    if not items:
        raise ValueError(f"runs {before_run!r} and {after_run!r} share no {mode} item")
    instant_correct = [i for i in items if i in b_all["instant"] and _correct(b_all["instant"][i])]
    share_change = None
    if instant_correct:
        share_change = paired_mean_difference([float(b[i].chosen != "instant") for i in instant_correct],
                                              [float(a[i].chosen != "instant") for i in instant_correct], samples, seed=seed)
    return BeforeAfter(
        before_run, after_run, mode, len(items), len(instant_correct),
        _side(b, items, instant_correct, samples, seed), _side(a, items, instant_correct, samples, seed),
        paired_mean_difference([float(_correct(b[i])) for i in items], [float(_correct(a[i])) for i in items], samples, seed=seed),
        paired_cost_of_pass_reduction([a[i].cost_usd for i in items], [a[i].correct for i in items],
                                      [b[i].cost_usd for i in items], [b[i].correct for i in items], samples, seed=seed),
        share_change,
    )


def _signed(value: float, unit: str) -> str:
    return "-inf" if value == -math.inf else f"{value * 100:+.1f}{unit}"


def _interval(r: Interval | None, unit: str = " points") -> str:
    if r is None:
        return "-"
    return f"{_signed(r.value, unit)} (95% CI {_signed(r.low, unit)} to {_signed(r.high, unit)})"


def _share(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1%}"


def markdown(result: BeforeAfter) -> str:
    b, a = result.before, result.after
    rows = [
        ["accuracy", f"{b.accuracy:.1%}", f"{a.accuracy:.1%}", _interval(result.accuracy_change)],
        ["cost of pass", f"{usd(b.cost_of_pass_usd)} ({usd(b.cost_of_pass_ci[0])} - {usd(b.cost_of_pass_ci[1])})",
         f"{usd(a.cost_of_pass_usd)} ({usd(a.cost_of_pass_ci[0])} - {usd(a.cost_of_pass_ci[1])})",
         "reduction " + _interval(result.cost_of_pass_reduction, unit="%")],
        [f"non-instant share on the {result.instant_correct_items} items the base answers in instant mode",
         _share(b.non_instant_share_on_instant_correct), _share(a.non_instant_share_on_instant_correct),
         _interval(result.non_instant_share_change)],
    ]
    return "\n\n".join([
        f"# Before and after · `{result.mode}` · {result.before_run} -> {result.after_run}",
        f"{result.items} items both runs answered in `{result.mode}` mode; intervals are 95% percentile intervals of a paired "
        "item-level bootstrap.",
        markdown_table(("figure", "before", "after", "change (after - before)"), rows),
    ]) + "\n"


def write_before_after(result: BeforeAfter, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "before_after.md", out / "before_after.json"]
    paths[0].write_text(markdown(result))
    paths[1].write_text(json.dumps(json_safe(asdict(result)), indent=2))
    return paths
