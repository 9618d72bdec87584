"""The evaluation report of one run, computed from its stored trajectories.

Per mode: pass@1, pass@k (the unbiased estimator of Chen et al. 2021), mean output tokens,
mean tool calls, mean cost, cost of pass with a bootstrap interval (A^2FM's metric), and for
routed modes (auto, learned) the share of each chosen mode, overall and by difficulty.
Written as Markdown, JSON and two PNG plots; shown as a table that fits the terminal; two runs can be compared.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gearshift.api.common.v1.common_pb2 import Trajectory, TrajectoryStatus
from gearshift.api.store.v1 import store_pb2
from gearshift.evaluation.runner import MODES, ROUTED, eval_mode_of, verifier_name
from gearshift.protocol import a2fm
from gearshift.protocol.modes import MODE_NAMES, mode_name
from gearshift.pricing import flat_total_usd
from gearshift.rewards.cost_of_pass import compute_cost_of_pass
from gearshift.tables import Column, TableData

CHOSEN = MODE_NAMES


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k)."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"need 0 < k <= n and 0 <= c <= n, got n={n} c={c} k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class ModeReport:
    """The figures of one evaluation mode."""

    mode: str
    items: int
    trajectories: int
    correct: int
    k: int
    pass_at_1: float
    pass_at_k: float
    mean_output_tokens: float
    mean_tool_calls: float
    mean_cost_usd: float
    cost_of_pass_usd: float
    cost_of_pass_ci: tuple[float, float]
    ungraded: int
    statuses: dict[str, int]
    mode_share: dict[str, float] = field(default_factory=dict)
    mode_share_by_difficulty: dict[str, dict[str, float]] = field(default_factory=dict)
    # Cost of pass with every input token at the full price (cost_of_pass_usd prices the tokens
    # the engine served from its prefix cache at the cached-input rate, as billed), and the share
    # of input tokens so served.
    flat_cost_of_pass_usd: float = math.inf
    cached_input_share: float = 0.0
    # Episodes that followed their mode's format on their own (followed_protocol).
    protocol_valid: float = 0.0
    # Episodes whose answer the executor asked for (its opener injected): at the step limit, or
    # after an agentic turn with neither a call nor an answer.
    answer_asked: float = 0.0


@dataclass
class RunReport:
    """A run's report: its tags and one ModeReport per mode, in MODES order."""

    run_id: str
    suite: str
    splits: list[str]
    modes: dict[str, ModeReport]
    # Jobs whose latest attempt FAILED (an infrastructure error), by mode: left out of the
    # figures, since they say nothing about the model; a resume runs them again.
    failed: dict[str, int] = field(default_factory=dict)


def _is_correct(trajectory: Trajectory) -> bool | None:
    """The suite's verdict; None when the trajectory was never graded by its suite."""
    reward = trajectory.reward
    if not trajectory.HasField("reward") or reward.verifier != verifier_name(trajectory.task_source):
        return None
    return reward.correct


def followed_protocol(trajectory: Trajectory) -> bool:
    """The policy gave its answer in its mode's format, on its own: the reward's format verdict,
    and not an answer the executor asked for (stored before the format check said so itself)."""
    return trajectory.reward.format_valid and not a2fm.answer_was_asked(trajectory.turns)


def _shares(modes: Iterable[str]) -> dict[str, float]:
    counts = Counter(modes)
    total = sum(counts.values())
    return {name: counts[name] / total for name in (*CHOSEN, "none") if counts[name]} if total else {}


def _difficulty_key(label: str) -> tuple:
    return (0, float(label), label) if label.replace(".", "", 1).lstrip("-").isdigit() else (1, 0.0, label)


def mode_report(mode: str, trajectories: list[Trajectory], bootstrap_samples: int = 2000, seed: int = 0) -> ModeReport:
    """The figures of one mode over its trajectories (one per item and sample)."""
    verdicts = [_is_correct(t) for t in trajectories]
    correct = [bool(v) for v in verdicts]
    per_item: dict[str, list[bool]] = defaultdict(list)
    for trajectory, ok in zip(trajectories, correct):
        per_item[trajectory.labels.get("item_id", trajectory.id)].append(ok)
    k = min(len(v) for v in per_item.values())
    costs = [t.cost.total_usd for t in trajectories]
    cop = compute_cost_of_pass(costs, correct, bootstrap_samples, seed=seed, items=[t.labels.get("item_id", t.id) for t in trajectories])
    input_tokens = sum(t.usage.input_tokens for t in trajectories)
    report = ModeReport(
        mode=mode,
        items=len(per_item),
        trajectories=len(trajectories),
        correct=sum(correct),
        k=k,
        pass_at_1=sum(sum(v) / len(v) for v in per_item.values()) / len(per_item),
        pass_at_k=sum(pass_at_k(len(v), sum(v), k) for v in per_item.values()) / len(per_item),
        mean_output_tokens=sum(t.usage.output_tokens for t in trajectories) / len(trajectories),
        mean_tool_calls=sum(len(turn.tool_calls) for t in trajectories for turn in t.turns) / len(trajectories),
        mean_cost_usd=sum(costs) / len(costs),
        cost_of_pass_usd=cop.cost_of_pass_usd,
        cost_of_pass_ci=(cop.ci_low_usd, cop.ci_high_usd),
        ungraded=sum(v is None for v in verdicts),
        statuses=dict(Counter(TrajectoryStatus.Name(t.status).removeprefix("TRAJECTORY_STATUS_").lower() for t in trajectories)),
        flat_cost_of_pass_usd=sum(flat_total_usd(t.cost) for t in trajectories) / sum(correct) if any(correct) else math.inf,
        cached_input_share=sum(t.usage.cached_input_tokens for t in trajectories) / input_tokens if input_tokens else 0.0,
        protocol_valid=sum(map(followed_protocol, trajectories)) / len(trajectories),
        answer_asked=sum(a2fm.answer_was_asked(t.turns) for t in trajectories) / len(trajectories),
    )
    if mode in ROUTED:
        chosen = [mode_name(t.mode) for t in trajectories]
        report.mode_share = _shares(chosen)
        by_difficulty: dict[str, list[str]] = defaultdict(list)
        for trajectory, name in zip(trajectories, chosen):
            by_difficulty[trajectory.labels.get("difficulty", "")].append(name)
        report.mode_share_by_difficulty = {d: _shares(by_difficulty[d]) for d in sorted(by_difficulty, key=_difficulty_key)}
    return report


def latest_attempts(trajectories: Iterable[Trajectory], failed: bool = False) -> list[Trajectory]:
    """A run's episodes, one per job (item, mode, sample): its latest attempt. Cancelled attempts
    never count; failed ones (an infrastructure error, nothing about the model) only when asked."""
    latest: dict[tuple[str, str, str], Trajectory] = {}
    for trajectory in sorted(trajectories, key=lambda t: (t.created_at.seconds, t.created_at.nanos)):
        if trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED:
            continue
        key = (trajectory.labels.get("item_id", trajectory.id), eval_mode_of(trajectory), trajectory.labels.get("sample", "0"))
        latest[key] = trajectory
    return [t for t in latest.values() if failed or t.status != TrajectoryStatus.TRAJECTORY_STATUS_FAILED]


def build_report(trajectories: Iterable[Trajectory], run_id: str, bootstrap_samples: int = 2000, seed: int = 0) -> RunReport:
    """The report of a run from its stored trajectories. For a job stored more than once the
    latest attempt counts; cancelled episodes are ignored and failed ones only counted."""
    latest = latest_attempts(trajectories, failed=True)
    if not latest:
        raise ValueError(f"run {run_id!r} has no finished trajectories")
    by_mode: dict[str, list[Trajectory]] = defaultdict(list)
    failed: Counter[str] = Counter()
    for trajectory in latest:
        mode = eval_mode_of(trajectory)
        if trajectory.status == TrajectoryStatus.TRAJECTORY_STATUS_FAILED:
            failed[mode] += 1
        else:
            by_mode[mode].append(trajectory)
    if not by_mode:
        raise ValueError(f"run {run_id!r}: every episode failed ({dict(failed)})")
    ordered = sorted(by_mode, key=lambda m: (MODES.index(m) if m in MODES else len(MODES), m))
    suites = sorted({t.task_source for t in latest})
    return RunReport(
        run_id=run_id,
        suite=",".join(suites),
        splits=sorted({t.split for t in latest}),
        modes={m: mode_report(m, by_mode[m], bootstrap_samples, seed) for m in ordered},
        failed=dict(failed),
    )


async def fetch_run(store, run_id: str) -> list[Trajectory]:
    """A run's trajectories from the store (turns included: tool calls are counted from them)."""
    request = store_pb2.ExportRequest(filter=store_pb2.TrajectoryFilter(run_id=run_id), include_turns=True)
    return [t async for t in store.Export(request)]


# Presentation


def usd(value: float) -> str:
    return "inf" if math.isinf(value) else f"${value:.6f}"


def _share_text(shares: dict[str, float]) -> str:
    return " ".join(f"{name} {share:.0%}" for name, share in shares.items()) or "-"


# In a terminal too narrow for all of them, the highest priorities are left out first.
SUMMARY_COLUMNS = (
    Column("mode"), Column("items", 4, justify="right"), Column("n", 1, justify="right"), Column("pass@1", justify="right"),
    Column("pass@k", 3, justify="right"), Column("valid", 3, justify="right"), Column("out tok", 3, justify="right"),
    Column("tool calls", 3, justify="right"), Column("mean cost", 2, justify="right"), Column("cost of pass", justify="right"),
    Column("95% CI", 4, justify="right"), Column("modes chosen", 1, wraps=True),
)


def _row(r: ModeReport) -> list[str]:
    return [
        r.mode, str(r.items), str(r.trajectories), f"{r.pass_at_1:.3f}", f"{r.pass_at_k:.3f} (k={r.k})", f"{r.protocol_valid:.0%}",
        f"{r.mean_output_tokens:.1f}", f"{r.mean_tool_calls:.2f}", usd(r.mean_cost_usd), usd(r.cost_of_pass_usd),
        f"{usd(r.cost_of_pass_ci[0])} - {usd(r.cost_of_pass_ci[1])}", _share_text(r.mode_share),
    ]


def summary_table(report: RunReport) -> TableData:
    """The run's figures per mode, as `gearshift eval` prints them (tables.print_table)."""
    title = f"run {report.run_id} · suite {report.suite} · split {','.join(report.splits)}"
    return TableData(SUMMARY_COLUMNS, [_row(r) for r in report.modes.values()], title)


def markdown_table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(report: RunReport) -> str:
    parts = [
        f"# Evaluation run `{report.run_id}`",
        f"Suite `{report.suite}`, split {', '.join(report.splits)}. Correctness is the suite's own grader; cost from the "
        "shared price table; cost of pass = total cost / correct answers, with a 95% percentile bootstrap interval.",
        markdown_table((column.header for column in SUMMARY_COLUMNS), (_row(r) for r in report.modes.values())),
    ]
    routed = [r for r in report.modes.values() if r.mode_share_by_difficulty]
    for r in routed:
        parts.append(f"## Modes chosen by `{r.mode}`, by difficulty")
        parts.append(markdown_table(("difficulty", *CHOSEN, "none"), (
            [d or "-", *(f"{shares.get(name, 0.0):.0%}" for name in (*CHOSEN, "none"))]
            for d, shares in r.mode_share_by_difficulty.items()
        )))
    statuses = {r.mode: r.statuses for r in report.modes.values()}
    parts.append("## Episode endings\n\n" + "\n".join(f"- {m}: {s}" for m, s in statuses.items()))
    if report.failed:
        parts.append(f"Left out of the figures, failed on an infrastructure error (a resume runs them again): {report.failed}")
    parts.append("![accuracy against cost](accuracy_cost.png)")
    if routed:
        parts.append("![mode share by difficulty](mode_share.png)")
    return "\n\n".join(parts) + "\n"


def json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def pyplot():
    """matplotlib's pyplot on the file-only backend (no display here), imported when first drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)


def plot_accuracy_cost(report: RunReport, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in report.modes.values():
        ax.scatter(r.mean_cost_usd, r.pass_at_1, s=60)
        ax.annotate(r.mode, (r.mean_cost_usd, r.pass_at_1), textcoords="offset points", xytext=(6, 4))
    ax.set_xlabel("mean cost per episode (USD)")
    ax.set_ylabel("pass@1")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"accuracy against cost · {report.run_id}")
    ax.grid(alpha=0.3)
    save_figure(fig, path)


def plot_mode_share(report: RunReport, path: Path) -> bool:
    """Stacked bars of the chosen modes per difficulty, one panel per routed mode; False if none."""
    routed = [r for r in report.modes.values() if r.mode_share_by_difficulty]
    if not routed:
        return False
    plt = pyplot()
    fig, axes = plt.subplots(1, len(routed), figsize=(5 * len(routed), 4), squeeze=False)
    for ax, r in zip(axes[0], routed):
        difficulties = list(r.mode_share_by_difficulty)
        bottom = [0.0] * len(difficulties)
        for name in (*CHOSEN, "none"):
            heights = [r.mode_share_by_difficulty[d].get(name, 0.0) for d in difficulties]
            ax.bar([d or "-" for d in difficulties], heights, bottom=bottom, label=name)
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_title(f"{r.mode}: mode share by difficulty")
        ax.set_xlabel("difficulty")
        ax.set_ylabel("share of episodes")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8)
    save_figure(fig, path)
    return True


def write_report(report: RunReport, out_dir: str | Path) -> list[Path]:
    """Writes report.md, report.json and the PNG plots; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "report.md", out / "report.json", out / "accuracy_cost.png"]
    written[0].write_text(markdown(report))
    written[1].write_text(json.dumps(json_safe(asdict(report)), indent=2))
    plot_accuracy_cost(report, written[2])
    if plot_mode_share(report, out / "mode_share.png"):
        written.append(out / "mode_share.png")
    return written


# Comparison


@dataclass(frozen=True)
class ModeDelta:
    """Run B minus run A for one mode present in both."""

    mode: str
    pass_at_1: tuple[float, float]
    mean_cost_usd: tuple[float, float]
    cost_of_pass_usd: tuple[float, float]
    mean_output_tokens: tuple[float, float]

    @property
    def cost_of_pass_change(self) -> float | None:
        """Relative change of cost of pass (B / A - 1); None when either is infinite or A is 0."""
        a, b = self.cost_of_pass_usd
        return b / a - 1 if math.isfinite(a) and math.isfinite(b) and a > 0 else None


def compare(a: RunReport, b: RunReport) -> list[ModeDelta]:
    """Per-mode figures of two runs side by side, for the modes both ran."""
    return [
        ModeDelta(
            mode,
            (a.modes[mode].pass_at_1, b.modes[mode].pass_at_1),
            (a.modes[mode].mean_cost_usd, b.modes[mode].mean_cost_usd),
            (a.modes[mode].cost_of_pass_usd, b.modes[mode].cost_of_pass_usd),
            (a.modes[mode].mean_output_tokens, b.modes[mode].mean_output_tokens),
        )
        for mode in a.modes
        if mode in b.modes
    ]


COMPARE_COLUMNS = (
    Column("mode"), Column("pass@1 A", 1, justify="right"), Column("pass@1 B", 1, justify="right"),
    Column("Δ pass@1", justify="right"), Column("mean cost A", 3, justify="right"), Column("mean cost B", 3, justify="right"),
    Column("cost of pass A", 2, justify="right"), Column("cost of pass B", 2, justify="right"),
    Column("Δ cost of pass", justify="right"), Column("out tok A", 4, justify="right"), Column("out tok B", 4, justify="right"),
)


def compare_table(a: RunReport, b: RunReport) -> TableData:
    table = TableData(COMPARE_COLUMNS, title=f"{b.run_id} against {a.run_id}")
    for d in compare(a, b):
        change = d.cost_of_pass_change
        table.rows.append([
            d.mode, f"{d.pass_at_1[0]:.3f}", f"{d.pass_at_1[1]:.3f}", f"{d.pass_at_1[1] - d.pass_at_1[0]:+.3f}",
            usd(d.mean_cost_usd[0]), usd(d.mean_cost_usd[1]), usd(d.cost_of_pass_usd[0]), usd(d.cost_of_pass_usd[1]),
            "-" if change is None else f"{change:+.1%}", f"{d.mean_output_tokens[0]:.1f}", f"{d.mean_output_tokens[1]:.1f}",
        ])
    return table
