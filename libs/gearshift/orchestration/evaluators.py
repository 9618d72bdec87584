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
from gearshift.evaluation.runner import eval_mode_of
from gearshift.orchestration.promotion import EvalResult
from gearshift.orchestration.steps import digest
from gearshift.rewards.scoring import apo_rewards
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


class GateEvaluator:
    """Evaluates checkpoints for the gate (the Evaluator protocol) on the settings' gate suite,
    split and size, in `modes`; the gate decides on `gate_mode`. Each checkpoint's figures are
    kept, so a round does not evaluate a checkpoint twice, and its run id names the evaluation
    config, so a resumed evaluation never mixes budgets or item sets."""

    def __init__(self, settings: Settings, modes: list[str] | None = None, gate_mode: str | None = None, concurrency: int = 1):
        self.settings = settings
        self.gate_mode = gate_mode or settings.orchestration.eval_mode
        self.modes = modes or [self.gate_mode]
        self.concurrency = concurrency
        self.figures: dict[str, dict[str, dict]] = {}

    def run_id(self, checkpoint: Checkpoint) -> str:
        o = self.settings.orchestration
        config = (o.eval_suite, o.eval_split, o.eval_items, self.modes, self.settings.executor.model_dump())
        return f"gate-{checkpoint.id}-{digest(*config)}"

    async def run(self, checkpoint: Checkpoint) -> dict[str, dict]:
        """Per-mode figures of the checkpoint (resumed when its run is partly stored)."""
        if checkpoint.id not in self.figures:
            o, run_id = self.settings.orchestration, self.run_id(checkpoint)
            async with embedded(self.settings, POLICY_CALLERS, policy_model=checkpoint.uri) as platform:
                await evaluate(platform.settings, o.eval_suite, self.modes, o.eval_items, split=o.eval_split, run_id=run_id,
                               concurrency=self.concurrency, out_dir=self.settings.data_dir / "eval" / run_id,
                               purpose=Purpose.PURPOSE_GATE)
            async with channel(self.settings.store_addr, self.settings) as ch:
                trajectories = await fetch_run(store_pb2_grpc.TrajectoryStoreStub(ch), run_id)
            self.figures[checkpoint.id] = mode_figures(trajectories, self.settings.reward) | {"run_id": run_id}
        return self.figures[checkpoint.id]

    def evaluate(self, checkpoint: Checkpoint, suite: str, split: str) -> EvalResult:
        """The gate mode's accuracy and cost of pass, every mode's figures as extras."""
        figures = self.figures.get(checkpoint.id) or asyncio.run(self.run(checkpoint))
        gate = figures[self.gate_mode]
        extra = {f"{mode}/{name}": value for mode, values in figures.items() if isinstance(values, dict)
                 for name, value in values.items() if isinstance(value, int | float)}
        cost = gate["cost_of_pass_usd"]
        return EvalResult(gate["accuracy"], math.inf if cost is None else cost, extra)
