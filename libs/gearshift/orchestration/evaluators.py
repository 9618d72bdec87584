"""The promotion gate's evaluation: the evaluation harness on one checkpoint's held-out split,
served by a built-in policy server of its own with its own planner, router and executor (the
callers of the policy), next to the configured store, sandbox and reward service, so the
serving policy is never disturbed by an evaluation."""

from __future__ import annotations

import asyncio
import math

from gearshift.api.common.v1.common_pb2 import Checkpoint, Purpose, Trajectory, TrajectoryStatus
from gearshift.api.store.v1 import store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.evaluation.harness import evaluate
from gearshift.evaluation.report import build_report, fetch_run
from gearshift.evaluation.runner import RETRIED, eval_mode_of
from gearshift.evaluation.suites import get_suite
from gearshift.orchestration.checkpoint_registry import published
from gearshift.orchestration.promotion import EvalResult, ItemOutcome
from gearshift.orchestration.task_bodies import digest
from gearshift.rewards.scoring import apo_rewards
from gearshift.routing.registry import ROUTER_KIND
from gearshift.settings import RewardSettings, Settings

POLICY_CALLERS = ("planner", "router", "executor")


def mode_figures(trajectories: list[Trajectory], reward: RewardSettings) -> dict[str, dict]:
    """Per evaluation mode: accuracy (pass@1), cost of pass, mean cost and output tokens from
    the harness report, the mean APO reward and the share of well-formed trajectories."""
    finished = [t for t in trajectories if t.status != TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED]
    rewards = apo_rewards(finished, reward)
    report = build_report(finished, "gate")
    figures = {}
    for mode, r in report.modes.items():
        mine = [t for t in finished if eval_mode_of(t) == mode]
        figures[mode] = {
            "accuracy": r.pass_at_1,
            "cost_of_pass_usd": r.cost_of_pass_usd if math.isfinite(r.cost_of_pass_usd) else None,
            "mean_cost_usd": r.mean_cost_usd,
            "mean_output_tokens": r.mean_output_tokens,
            "apo_reward": sum(rewards[t.id] for t in mine) / len(mine),
            "format_valid": sum(t.reward.format_valid for t in mine) / len(mine),
            "episodes": r.trajectories,
        }
    return figures


def outcomes_of(trajectories: list[Trajectory], mode: str) -> dict[str, ItemOutcome]:
    """Per item, the finished attempts of one evaluation mode: cost, correct, attempts."""
    items: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        if eval_mode_of(t) == mode and t.status not in RETRIED:
            items.setdefault(t.labels.get("item_id", t.id), []).append(t)
    return {item: ItemOutcome(sum(t.cost.total_usd for t in ts), sum(t.reward.correct for t in ts), len(ts)) for item, ts in items.items()}


FAILED_RERUNS = 2  # resumes of a gate run whose episodes failed on an infrastructure error


class GateEvaluator:
    """Evaluates checkpoints for the gate (the Evaluator protocol) on the settings' gate suite,
    split and size: in the gate modes (and `learned` where a router is published), plus any
    modes the caller wants figures of. Each checkpoint's trajectories are kept, and its run id
    names the evaluation config, so a resumed evaluation never mixes budgets or item sets, and
    one that is complete in the store is not started again."""

    def __init__(self, settings: Settings, report_modes: list[str] | None = None, concurrency: int | None = None):
        self.settings = settings
        self.report_modes = list(report_modes or [])
        self.concurrency = concurrency or settings.orchestration.eval_concurrency
        self.trajectories: dict[str, list[Trajectory]] = {}

    async def gate_modes(self) -> list[str]:
        modes = list(self.settings.orchestration.gate_modes)
        if "learned" not in modes and await published(self.settings, ROUTER_KIND) is not None:
            modes.append("learned")
        return modes

    def run_id(self, checkpoint: Checkpoint, modes: list[str]) -> str:
        o = self.settings.orchestration
        config = (o.eval_suite, o.eval_split, o.eval_items, sorted(modes), self.settings.executor.model_dump())
        return f"gate-{checkpoint.id}-{digest(*config)}"

    async def run(self, checkpoint: Checkpoint) -> dict[str, dict]:
        """Per-mode figures of the checkpoint in every mode evaluated (gate and report modes)."""
        modes = list(dict.fromkeys([*await self.gate_modes(), *self.report_modes]))
        if checkpoint.id not in self.trajectories:
            self.trajectories[checkpoint.id] = await self._evaluated(checkpoint, modes)
        return mode_figures(self.trajectories[checkpoint.id], self.settings.reward) | {"run_id": self.run_id(checkpoint, modes)}

    async def _evaluated(self, checkpoint: Checkpoint, modes: list[str]) -> list[Trajectory]:
        o, run_id = self.settings.orchestration, self.run_id(checkpoint, modes)
        async with channel(self.settings.store_addr, self.settings) as ch:
            stored = await fetch_run(store_pb2_grpc.TrajectoryStoreStub(ch), run_id)
        planned = len(get_suite(o.eval_suite).items(o.eval_split, o.eval_items)) * len(modes)
        if sum(t.status not in RETRIED for t in stored) >= planned:
            return stored  # complete: no need to serve the checkpoint again
        async with self.serving(checkpoint) as platform:
            # An episode failed on an infrastructure error (a call timed out on a loaded machine) is
            # left out of the figures, and the runner stops the rest: resume, so that base and
            # candidate are judged on the same items.
            for _ in range(1 + FAILED_RERUNS):
                run = await evaluate(platform.settings, o.eval_suite, modes, o.eval_items, split=o.eval_split, run_id=run_id,
                                     concurrency=self.concurrency, out_dir=self.settings.data_dir / "eval" / run_id,
                                     purpose=Purpose.PURPOSE_GATE)
                if not (run.report.failed or run.summary.aborted):
                    break
        async with channel(self.settings.store_addr, self.settings) as ch:
            return await fetch_run(store_pb2_grpc.TrajectoryStoreStub(ch), run_id)

    def serving(self, checkpoint: Checkpoint):
        """The callers of the policy, with a built-in policy server of their own serving the checkpoint."""
        return embedded(self.settings, POLICY_CALLERS, policy_model=checkpoint.uri)

    def evaluate(self, checkpoint: Checkpoint) -> dict[str, EvalResult]:
        """One result per gate mode, with the per-item outcomes the gate's intervals need."""
        return asyncio.run(self._results(checkpoint))

    async def _results(self, checkpoint: Checkpoint) -> dict[str, EvalResult]:
        figures = await self.run(checkpoint)
        trajectories = self.trajectories[checkpoint.id]
        extras = {mode: {k: v for k, v in values.items() if k in ("apo_reward", "mean_cost_usd", "format_valid")}
                  for mode, values in figures.items() if isinstance(values, dict)}
        return {mode: EvalResult.of(outcomes_of(trajectories, mode), extras.get(mode)) for mode in await self.gate_modes()}
