"""The headline report: every mode on the same test items, the cost-of-pass reduction of each
adaptive mode (auto, learned) against each forced mode with a paired item-level bootstrap
interval, mode shares by family, routing accuracy against the per-item oracle, and the goal
check. Computed from the stored trajectories of one run; pure apart from writing files.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gearshift.api.common.v1.common_pb2 import Trajectory, TrajectoryStatus
from gearshift.evaluation.report import CHOSEN, ModeReport, json_safe, markdown_table, mode_report, pyplot, save_figure, usd
from gearshift.evaluation.runner import FORCED, MODES, ROUTED, eval_mode_of
from gearshift.evaluation.suites import family_of_trajectory
from gearshift.pricing import flat_total_usd
from gearshift.protocol.modes import mode_name
from gearshift.rewards.cost_of_pass import Interval, cheapest_correct, oracle_routing_accuracy, paired_cost_of_pass_reduction

FORCED_ORDER = tuple(FORCED)
ADAPTIVE = tuple(ROUTED)


@dataclass(frozen=True)
class Goal:
    """The headline goal (docs/results/headline.md): an adaptive mode's cost of pass this far below each forced
    mode, each reduction's interval above zero, at accuracy at most `accuracy_slack` below the
    best forced mode; and every forced mode following the protocol (its format valid, its answer
    not asked for) in at least `validity_floor` of its episodes."""

    reductions: tuple[tuple[str, float], ...] = (("reasoning", 0.45), ("agentic", 0.33))
    accuracy_slack: float = 0.01
    validity_floor: float = 0.95


GOAL = Goal()


@dataclass(frozen=True)
class Outcome:
    """One item in one mode: total cost (cached input priced as billed; and flat, every input
    token at the full price), correct attempts, attempts, the mode chosen, its family."""

    cost_usd: float
    correct: int
    attempts: int
    chosen: str
    family: str
    flat_cost_usd: float


@dataclass
class GoalCheck:
    mode: str
    met: bool
    reasons: list[str]


@dataclass
class HeadlineReport:
    run_id: str
    suite: str
    items: int
    items_per_family: dict[str, int]
    modes: dict[str, ModeReport]
    # adaptive mode -> forced mode -> the reduction of cost of pass (0.45 = 45% cheaper), paired
    # interval; cached input tokens priced as billed (reductions, the goal's) and flat
    reductions: dict[str, dict[str, Interval]]
    flat_reductions: dict[str, dict[str, Interval]]
    # routed mode -> family -> chosen mode -> share
    mode_share_by_family: dict[str, dict[str, dict[str, float]]]
    # mode -> family -> accuracy (pass@1 over the family's items)
    accuracy_by_family: dict[str, dict[str, float]]
    # routed mode -> {"accuracy": ..., "items": ...} against the cheapest correct forced mode
    routing_accuracy: dict[str, dict[str, float]]
    goal: list[GoalCheck]  # one per adaptive mode
    goal_met: bool  # an adaptive mode met its goal, and the forced modes their validity
    validity: GoalCheck | None = None  # the forced modes' protocol validity
    budgets: dict = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    bootstrap_samples: int = 2000
    # The learned router that served `learned`: its version and the registry's offline figures
    # (trained on the train run, evaluated on the test run's forced outcomes).
    router: dict = field(default_factory=dict)

    def checks(self) -> list[GoalCheck]:
        """Every goal check: one per adaptive mode, then the forced modes' validity."""
        return [*self.goal, *([self.validity] if self.validity else [])]


def latest_finished(trajectories: list[Trajectory]) -> tuple[dict[tuple[str, str, str], Trajectory], Counter]:
    """(item, mode, sample) -> the latest finished attempt, and the count of jobs whose latest
    attempt failed (an infrastructure error: left out, a resume runs them again)."""
    latest: dict[tuple[str, str, str], Trajectory] = {}
    for t in sorted(trajectories, key=lambda t: (t.created_at.seconds, t.created_at.nanos)):
        if t.status != TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED:
            latest[(t.labels.get("item_id", t.id), eval_mode_of(t), t.labels.get("sample", "0"))] = t
    failed = Counter(mode for (_, mode, _), t in latest.items() if t.status == TrajectoryStatus.TRAJECTORY_STATUS_FAILED)
    return {k: t for k, t in latest.items() if t.status != TrajectoryStatus.TRAJECTORY_STATUS_FAILED}, failed


def item_outcomes(latest: dict[tuple[str, str, str], Trajectory]) -> dict[str, dict[str, Outcome]]:
    """mode -> item -> Outcome (samples of an item summed)."""
    grouped: dict[str, dict[str, list[Trajectory]]] = defaultdict(lambda: defaultdict(list))
    for (item, mode, _), t in latest.items():
        grouped[mode][item].append(t)
    return {
        mode: {item: Outcome(sum(t.cost.total_usd for t in ts), sum(t.reward.correct for t in ts), len(ts), mode_name(ts[0].mode),
                             family_of_trajectory(ts[0]), sum(flat_total_usd(t.cost) for t in ts))
               for item, ts in by_item.items()}
        for mode, by_item in grouped.items()
    }


def reduction(outcomes: dict[str, dict[str, Outcome]], adaptive: str, forced: str, samples: int, seed: int = 0,
              flat: bool = False) -> Interval:
    """The paired cost-of-pass reduction of `adaptive` against `forced` on the items both ran
    (flat: every input token at the full price)."""
    common = sorted(set(outcomes[adaptive]) & set(outcomes[forced]))
    if not common:
        raise ValueError(f"{adaptive} and {forced} share no item")
    a, f = outcomes[adaptive], outcomes[forced]

    def cost(o: Outcome) -> float:
        return o.flat_cost_usd if flat else o.cost_usd

    return paired_cost_of_pass_reduction([cost(a[i]) for i in common], [a[i].correct for i in common],
                                         [cost(f[i]) for i in common], [f[i].correct for i in common], samples, seed=seed)


def oracle_of(outcomes: dict[str, dict[str, Outcome]], item: str) -> str | None:
    """The cheapest forced mode that was correct on the item (majority of its samples)."""
    return cheapest_correct({m: (outcomes[m][item].cost_usd, outcomes[m][item].correct * 2 >= outcomes[m][item].attempts > 0)
                             for m in FORCED_ORDER if item in outcomes.get(m, {})}, FORCED_ORDER)


def routing_accuracy(outcomes: dict[str, dict[str, Outcome]], routed: str) -> dict[str, float]:
    """How often the routed mode chose the per-item oracle, over items every forced mode ran."""
    items = [i for i in sorted(outcomes[routed]) if all(i in outcomes.get(m, {}) for m in FORCED_ORDER)]
    accuracy, counted = oracle_routing_accuracy([outcomes[routed][i].chosen for i in items], [oracle_of(outcomes, i) for i in items])
    return {"accuracy": accuracy, "items": float(counted), "items_without_oracle": float(len(items) - counted)}


def shares_by_family(outcomes: dict[str, Outcome]) -> dict[str, dict[str, float]]:
    by_family: dict[str, Counter] = defaultdict(Counter)
    for outcome in outcomes.values():
        by_family[outcome.family][outcome.chosen] += 1
    return {family: {m: counts[m] / sum(counts.values()) for m in (*CHOSEN, "none") if counts[m]}
            for family, counts in sorted(by_family.items())}


def accuracy_by_family(outcomes: dict[str, Outcome]) -> dict[str, float]:
    """family -> the mean over its items of the share of correct attempts (pass@1)."""
    by_family: dict[str, list[float]] = defaultdict(list)
    for outcome in outcomes.values():
        by_family[outcome.family].append(outcome.correct / outcome.attempts)
    return {family: sum(shares) / len(shares) for family, shares in sorted(by_family.items())}


def check_goal(mode: str, modes: dict[str, ModeReport], reductions: dict[str, Interval], goal: Goal = GOAL) -> GoalCheck:
    """The goal for one adaptive mode, with a reason per condition (met or not)."""
    reasons, met = [], True
    for forced, target in goal.reductions:
        r = reductions.get(forced)
        if r is None:
            met = False
            reasons.append(f"no forced {forced} run to compare with")
            continue
        ok = r.value >= target and r.above_zero
        met &= ok
        reasons.append(f"{'ok' if ok else 'NOT MET'}: {r.value:+.1%} vs forced {forced} (95% CI {r.low:+.1%} to {r.high:+.1%}; "
                       f"need >= {target:.0%} with the interval above 0)")
    forced_accuracy = {m: r.pass_at_1 for m, r in modes.items() if m in FORCED}
    if forced_accuracy:
        best = max(forced_accuracy, key=forced_accuracy.get)
        gap = modes[mode].pass_at_1 - forced_accuracy[best]
        ok = gap >= -goal.accuracy_slack - 1e-12
        met &= ok
        reasons.append(f"{'ok' if ok else 'NOT MET'}: accuracy {modes[mode].pass_at_1:.1%}, {gap * 100:+.1f} points against the best "
                       f"forced mode ({best}, {forced_accuracy[best]:.1%}; need >= {-goal.accuracy_slack * 100:.0f})")
    return GoalCheck(mode, met, reasons)


def check_validity(modes: dict[str, ModeReport], goal: Goal = GOAL) -> GoalCheck:
    """Every forced mode follows the protocol in at least the goal's share of its episodes."""
    reasons, met = [], True
    for mode in (m for m in FORCED_ORDER if m in modes):
        ok = modes[mode].protocol_valid >= goal.validity_floor - 1e-12
        met &= ok
        reasons.append(f"{'ok' if ok else 'NOT MET'}: forced {mode} protocol valid {modes[mode].protocol_valid:.1%} "
                       f"(need >= {goal.validity_floor:.0%})")
    return GoalCheck("forced modes", met, reasons)


def build_headline(trajectories: list[Trajectory], run_id: str, budgets: dict | None = None, bootstrap_samples: int = 2000,
                   seed: int = 0, goal: Goal = GOAL) -> HeadlineReport:
    """The headline report of a run's stored trajectories."""
    latest, failed = latest_finished(trajectories)
    if not latest:
        raise ValueError(f"run {run_id!r} has no finished trajectories")
    by_mode: dict[str, list[Trajectory]] = defaultdict(list)
    for (_, mode, _), t in latest.items():
        by_mode[mode].append(t)
    ordered = sorted(by_mode, key=lambda m: (MODES.index(m) if m in MODES else len(MODES), m))
    modes = {m: mode_report(m, by_mode[m], bootstrap_samples, seed) for m in ordered}
    outcomes = item_outcomes(latest)
    adaptive = [m for m in ordered if m in ROUTED]
    forced = [m for m in ordered if m in FORCED]
    reductions, flat_reductions = (
        {a: {f: reduction(outcomes, a, f, bootstrap_samples, seed, flat) for f in forced} for a in adaptive} if forced else {}
        for flat in (False, True))
    routable = all(m in outcomes for m in FORCED_ORDER)
    goal_checks = [check_goal(a, modes, reductions.get(a, {}), goal) for a in adaptive]
    validity = check_validity(modes, goal)
    family_of_item = {item: o.family for by_item in outcomes.values() for item, o in by_item.items()}
    return HeadlineReport(
        run_id=run_id,
        suite=",".join(sorted({t.task_source for t in latest.values()})),
        items=len(family_of_item),
        items_per_family=dict(sorted(Counter(family_of_item.values()).items())),
        modes=modes,
        reductions=reductions,
        flat_reductions=flat_reductions,
        mode_share_by_family={a: shares_by_family(outcomes[a]) for a in adaptive},
        accuracy_by_family={m: accuracy_by_family(outcomes[m]) for m in ordered},
        routing_accuracy={a: routing_accuracy(outcomes, a) for a in adaptive} if routable else {},
        goal=goal_checks,
        goal_met=any(g.met for g in goal_checks) and validity.met,
        validity=validity,
        budgets=dict(budgets or {}),
        failed=dict(failed),
        bootstrap_samples=bootstrap_samples,
    )


# Presentation

COLUMNS = ("mode", "items", "accuracy", "protocol valid", "answer asked for", "mean out tokens", "mean tool calls", "mean cost", "cost of pass",
           "95% CI", "cached input", "cost of pass, flat")


def _pct(value: float) -> str:
    return "-inf" if value == -math.inf else "inf" if value == math.inf else f"{value:+.1%}"


def markdown(report: HeadlineReport) -> str:
    families = ", ".join(f"{f} {n}" for f, n in report.items_per_family.items())
    parts = [
        f"# The headline measurement · run `{report.run_id}`",
        f"Suite `{report.suite}`, test split: {report.items} items ({families}). Every mode ran the same items with the same "
        f"budgets and decoding. Cost of pass = total cost / correct answers; intervals are 95% percentile intervals of an "
        f"item-level bootstrap ({report.bootstrap_samples} resamples); reductions are paired (each resample draws the items "
        f"once and computes both modes on them).",
        "## Modes",
        markdown_table(COLUMNS, ([r.mode, str(r.items), f"{r.pass_at_1:.1%}", f"{r.protocol_valid:.0%}", f"{r.answer_asked:.0%}", f"{r.mean_output_tokens:.1f}",
                                   f"{r.mean_tool_calls:.2f}", usd(r.mean_cost_usd), usd(r.cost_of_pass_usd), f"{usd(r.cost_of_pass_ci[0])} - {usd(r.cost_of_pass_ci[1])}",
                                   f"{r.cached_input_share:.0%}", usd(r.flat_cost_of_pass_usd)]
                                  for r in report.modes.values())),
    ]
    names = list(report.items_per_family)
    parts.append("## Accuracy by family")
    parts.append(markdown_table(("mode", *names), (
        [mode, *(f"{by_family[f]:.1%}" if f in by_family else "-" for f in names)] for mode, by_family in report.accuracy_by_family.items())))
    if report.reductions:
        parts.append("## Cost-of-pass reduction of each adaptive mode against each forced mode")
        parts.append("Priced as billed: input tokens the engine served from its prefix cache at the cached-input rate (the "
                     "goal's figures); flat: every input token at the full rate.")
        parts.append(markdown_table(("adaptive", "against", "reduction", "95% CI (paired)", "interval above 0", "flat", "flat 95% CI"), (
            [a, f, _pct(r.value), f"{_pct(r.low)} to {_pct(r.high)}", "yes" if r.above_zero else "no",
             _pct(flat.value), f"{_pct(flat.low)} to {_pct(flat.high)}"]
            for a, by_forced in report.reductions.items() for f, r in by_forced.items()
            for flat in [report.flat_reductions[a][f]])))
    if report.routing_accuracy:
        parts.append("## Routing accuracy against the per-item oracle (the cheapest forced mode that was correct)")
        parts.append(markdown_table(("mode", "routing accuracy", "items with an oracle", "items no mode answered"), (
            [m, f"{r['accuracy']:.1%}" if math.isfinite(r["accuracy"]) else "-", str(int(r["items"])), str(int(r["items_without_oracle"]))]
            for m, r in report.routing_accuracy.items())))
    if report.router:
        offline = report.router.get("eval_metrics", {})
        figures = ", ".join(f"{k} {offline[k]:.3g}" for k in ("routing_accuracy", "learned_accuracy", "eval_items") if k in offline)
        value = offline.get("train/pass_value_usd")
        worth = f", a pass worth ${value:.6f} to it (its cost of pass over its training queries)" if value is not None else ""
        parts.append(f"The learned router `{report.router['version']}`: trained on run `{report.router.get('train_run', '')}`{worth}; "
                     f"offline on the test run's forced outcomes: {figures or 'not evaluated'}.")
    for mode, by_family in report.mode_share_by_family.items():
        parts.append(f"## Modes chosen by `{mode}`, by family")
        parts.append(markdown_table(("family", *CHOSEN, "none"), (
            [family, *(f"{shares.get(name, 0.0):.0%}" for name in (*CHOSEN, "none"))] for family, shares in by_family.items())))
    parts.append(f"## Goal check: {'MET' if report.goal_met else 'NOT MET'}")
    goal_lines = [f"- `{g.mode}`: {'met' if g.met else 'not met'}\n" + "\n".join(f"  - {reason}" for reason in g.reasons)
                  for g in report.checks()]
    parts.append("\n".join(goal_lines) or "No adaptive mode ran: nothing to check.")
    if report.budgets:
        parts.append("## Budgets and decoding (every mode)\n\n" + "\n".join(f"- {k}: {v}" for k, v in report.budgets.items()))
    if report.failed:
        parts.append(f"Left out, failed on an infrastructure error (a resume runs them again): {report.failed}")
    parts.append("![accuracy against cost of pass](accuracy_cost_of_pass.png)")
    if report.reductions:
        parts.append("![cost-of-pass reductions](reductions.png)")
    if report.mode_share_by_family:
        parts.append("![mode share by family](mode_share_by_family.png)")
    return "\n\n".join(parts) + "\n"


def plot_accuracy_cost_of_pass(report: HeadlineReport, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in report.modes.values():
        if not math.isfinite(r.cost_of_pass_usd):
            continue
        low, high = r.cost_of_pass_ci
        xerr = [[r.cost_of_pass_usd - low], [(high - r.cost_of_pass_usd) if math.isfinite(high) else 0.0]]
        ax.errorbar(r.cost_of_pass_usd, r.pass_at_1, xerr=xerr, fmt="o", capsize=3)
        ax.annotate(r.mode, (r.cost_of_pass_usd, r.pass_at_1), textcoords="offset points", xytext=(6, 4))
    ax.set_xlabel("cost of pass (USD per correct answer, 95% CI)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"accuracy against cost of pass · {report.run_id}")
    ax.grid(alpha=0.3)
    save_figure(fig, path)


def _clipped(value: float) -> float:
    """-inf (no correct answer in a resample) is drawn at the axis edge."""
    return max(-1.0, min(1.0, value))


def plot_reductions(report: HeadlineReport, path: Path) -> None:
    plt = pyplot()
    rows = [(f"{a} vs {f}", r) for a, by_forced in report.reductions.items() for f, r in by_forced.items()]
    fig, ax = plt.subplots(figsize=(6, 0.5 * len(rows) + 1.5))
    for y, (_, r) in enumerate(rows):
        ax.plot([_clipped(r.low), _clipped(r.high)], [y, y], color="tab:blue")
        ax.plot(_clipped(r.value), y, "o", color="tab:blue")
    for forced, target in GOAL.reductions:
        ax.axvline(target, linestyle="--", alpha=0.5, label=f"goal vs {forced} ({target:.0%})")
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [name for name, _ in rows])
    ax.set_xlabel("cost-of-pass reduction (95% paired CI)")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def plot_mode_share_by_family(report: HeadlineReport, path: Path) -> None:
    plt = pyplot()
    routed = list(report.mode_share_by_family.items())
    fig, axes = plt.subplots(1, len(routed), figsize=(5 * len(routed), 4), squeeze=False)
    for ax, (mode, by_family) in zip(axes[0], routed):
        families = list(by_family)
        bottom = [0.0] * len(families)
        for name in (*CHOSEN, "none"):
            heights = [by_family[f].get(name, 0.0) for f in families]
            ax.bar(families, heights, bottom=bottom, label=name)
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_title(f"{mode}: modes chosen by family")
        ax.set_ylabel("share of items")
        ax.set_ylim(0, 1)
        ax.tick_params(axis="x", labelrotation=20)
        ax.legend(fontsize=8)
    save_figure(fig, path)


def to_json(report: HeadlineReport) -> dict:
    data = asdict(report)
    for name in ("reductions", "flat_reductions"):
        data[name] = {a: {f: asdict(r) | {"above_zero": r.above_zero} for f, r in by.items()} for a, by in getattr(report, name).items()}
    return json_safe(data)


def write_headline(report: HeadlineReport, out_dir: str | Path) -> list[Path]:
    """Writes report.md, report.json and the PNG plots; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "report.md", out / "report.json", out / "accuracy_cost_of_pass.png"]
    written[0].write_text(markdown(report))
    written[1].write_text(json.dumps(to_json(report), indent=2))
    plot_accuracy_cost_of_pass(report, written[2])
    if report.reductions:
        plot_reductions(report, out / "reductions.png")
        written.append(out / "reductions.png")
    if report.mode_share_by_family:
        plot_mode_share_by_family(report, out / "mode_share_by_family.png")
        written.append(out / "mode_share_by_family.png")
    return written
