"""Evaluators for the promotion gate: the evaluation harness run on a checkpoint, served by a
built-in policy server of its own next to an in-process stack (so the serving policy is never
disturbed by an evaluation)."""

from __future__ import annotations

import asyncio

from gearshift.common.v1.common_pb2 import Checkpoint
from gearshift.orchestration.promotion import EvalResult
from gearshift.settings import Settings


class HarnessEvaluator:
    """`gearshift eval` on one suite split, in one mode, for one checkpoint."""

    def __init__(self, settings: Settings, n: int | None = None, mode: str | None = None):
        self.settings = settings
        self.n = n or settings.orchestration.eval_items
        self.mode = mode or settings.orchestration.eval_mode

    def evaluate(self, checkpoint: Checkpoint, suite: str, split: str) -> EvalResult:
        return asyncio.run(self._evaluate(checkpoint, suite, split))

    async def _evaluate(self, checkpoint: Checkpoint, suite: str, split: str) -> EvalResult:
        from gearshift.evaluation.harness import evaluate, stack_for

        policy = self.settings.policy.model_copy(update={"model": checkpoint.uri})
        settings = self.settings.model_copy(update={"policy": policy, "policy_model": policy.served_model_name})
        run_id = f"gate-{checkpoint.id}-{suite}-{split}"
        async with stack_for(settings, inprocess=True) as stack:
            evaluation = await evaluate(stack, suite, [self.mode], self.n, split=split, run_id=run_id,
                                        out_dir=self.settings.data_dir / "eval" / run_id)
        report = evaluation.report.modes[self.mode]
        return EvalResult(report.pass_at_1, report.cost_of_pass_usd, {"mean_cost_usd": report.mean_cost_usd})
