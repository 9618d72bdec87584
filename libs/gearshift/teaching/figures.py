"""The default policy's figures against its base, from stored evaluation runs of held-out items:
per family and mode, protocol validity (the transcript passes its mode's format check, as the
reward service decided), tool calls that parse, accuracy, and which mode the model picked
itself (auto). The goals are the ones the default policy was built to meet.

    gearshift default-policy figures --base RUN --trained RUN
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from gearshift.api.common.v1.common_pb2 import Trajectory
from gearshift.evaluation.report import followed_protocol, latest_attempts, markdown_table
from gearshift.evaluation.runner import FORCED, eval_mode_of
from gearshift.evaluation.suites import family_of_trajectory
from gearshift.protocol.a2fm import REJECTED_CALL_PREFIX
from gearshift.protocol.modes import mode_name


@dataclass
class Cell:
    """One family under one evaluation mode."""

    episodes: int = 0
    correct: int = 0
    format_valid: int = 0
    calls: int = 0  # tool calls written, parsed or not
    rejected: int = 0  # of those, the ones that did not parse
    chosen: Counter = field(default_factory=Counter)  # mode actually run (auto picks it)

    def merge(self, other: Cell) -> None:
        self.episodes += other.episodes
        self.correct += other.correct
        self.format_valid += other.format_valid
        self.calls += other.calls
        self.rejected += other.rejected
        self.chosen += other.chosen

    def add(self, trajectory: Trajectory) -> None:
        self.episodes += 1
        self.correct += trajectory.reward.correct
        self.format_valid += followed_protocol(trajectory)
        for turn in trajectory.turns:
            rejected = sum(r.call_id.startswith(REJECTED_CALL_PREFIX) for r in turn.tool_results)
            self.rejected += rejected
            self.calls += len(turn.tool_calls) + rejected
        self.chosen[mode_name(trajectory.mode)] += 1

    @property
    def accuracy(self) -> float:
        return self.correct / self.episodes

    @property
    def validity(self) -> float:
        return self.format_valid / self.episodes

    @property
    def parsed(self) -> float | None:
        return (self.calls - self.rejected) / self.calls if self.calls else None

    def share(self, mode: str) -> float:
        return self.chosen[mode] / self.episodes


Figures = dict[tuple[str, str], Cell]  # (family, eval mode) -> cell


def figures(trajectories: list[Trajectory]) -> Figures:
    cells: Figures = defaultdict(Cell)
    for trajectory in latest_attempts(trajectories):
        cells[(family_of_trajectory(trajectory), eval_mode_of(trajectory))].add(trajectory)
    return dict(cells)


def by_mode(cells: Figures, mode: str) -> Cell:
    """One mode over every family."""
    total = Cell()
    for (_, m), cell in cells.items():
        if m == mode:
            total.merge(cell)
    return total


@dataclass
class Goal:
    name: str
    met: bool
    measured: str


def goals(base: Figures, trained: Figures) -> list[Goal]:
    """The default policy's goals, each with what was measured; a goal without data is unmet."""
    found = []
    for mode in FORCED:
        cell = by_mode(trained, mode)
        found.append(Goal(f"protocol validity >= 95% ({mode})", cell.episodes > 0 and cell.validity >= 0.95,
                          f"{cell.validity:.1%} of {cell.episodes}" if cell.episodes else "not run"))
    agentic = by_mode(trained, "agentic")
    found.append(Goal("tool calls parse >= 95% (agentic)", agentic.parsed is not None and agentic.parsed >= 0.95,
                      f"{agentic.parsed:.1%} of {agentic.calls}" if agentic.parsed is not None else "no tool call written"))

    def cell_goal(name: str, cells: Figures, key: tuple[str, str], value, threshold: float) -> Goal:
        cell = cells.get(key)
        if cell is None:
            return Goal(name, False, "not run")
        return Goal(name, value(cell) >= threshold, f"{value(cell):.1%} of {cell.episodes}")

    found.append(cell_goal("agentic accuracy on large products >= 90%", trained, ("large_multiplication", "agentic"), lambda c: c.accuracy, 0.90))
    base_facts = base.get(("facts", "instant"))
    found.append(cell_goal("facts instant accuracy >= the base model's", trained, ("facts", "instant"), lambda c: c.accuracy,
                           base_facts.accuracy if base_facts else float("inf")))
    found.append(cell_goal("auto picks instant for >= 80% of facts", trained, ("facts", "auto"), lambda c: c.share("instant"), 0.80))
    found.append(cell_goal("auto picks agentic for >= 80% of large products", trained, ("large_multiplication", "auto"), lambda c: c.share("agentic"), 0.80))
    return found


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


COLUMNS = ("family", "mode", "n", "accuracy (base → trained)", "format valid", "tool calls parse", "picked instant / reasoning / agentic")


def markdown(base: Figures, trained: Figures) -> str:
    """Side by side, base then trained, one row per family and mode; then the goals."""
    rows = []
    for family, mode in sorted(set(base) | set(trained)):
        b, t = base.get((family, mode)), trained.get((family, mode))

        def pair(value, b=b, t=t) -> str:
            return f"{_pct(value(b)) if b else '-'} → {_pct(value(t)) if t else '-'}"

        n = "/".join(str(c.episodes) if c else "-" for c in (b, t))
        picks = " / ".join(_pct(t.share(m)) for m in FORCED) if mode not in FORCED and t else "-"
        rows.append([family, mode, n, pair(lambda c: c.accuracy), pair(lambda c: c.validity), pair(lambda c: c.parsed), picks])
    met = [[g.name, g.measured, "yes" if g.met else "no"] for g in goals(base, trained)]
    return f"{markdown_table(COLUMNS, rows)}\n\n{markdown_table(('goal', 'measured', 'met'), met)}\n"
