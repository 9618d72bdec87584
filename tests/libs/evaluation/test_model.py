"""A small suite end to end with the real SmolLM2: every service in process over gRPC, the
built-in policy server, the Postgres store; 2 items x instant + auto, then the report files.
Tiny budgets keep it near a minute on two CPU cores."""

from __future__ import annotations

import json

import pytest
from gearshift.api.common.v1.common_pb2 import TrajectoryStatus
from gearshift.api.store.v1 import store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.evaluation.harness import evaluate
from gearshift.evaluation.report import fetch_run
from gearshift.settings import ExecutorSettings, RouterSettings

TINY = {
    "executor": ExecutorSettings(max_tokens_per_turn=16, max_steps_agentic=1, max_steps_other=1),
    "router": RouterSettings(max_attempts=1, max_tokens=24),
}
FINISHED = {TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, TrajectoryStatus.TRAJECTORY_STATUS_BUDGET_EXHAUSTED}


@pytest.mark.model
async def test_small_suite_end_to_end(settings, postgres_url, builtin_policy, tmp_path):
    configured = settings.with_policy(builtin_policy).model_copy(update={"database_url": postgres_url, **TINY})
    async with embedded(configured) as platform:
        stack = platform.settings
        result = await evaluate(stack, "default", ["instant", "auto"], 2, run_id="model-e2e", concurrency=2, out_dir=tmp_path)
        async with channel(stack.store_addr, stack) as ch:
            stored = await fetch_run(store_pb2_grpc.TrajectoryStoreStub(ch), "model-e2e")

    assert result.summary.solved == 4 and not result.summary.errors
    assert len(stored) == 4 and all(t.status in FINISHED and t.usage.output_tokens > 0 for t in stored)
    assert all(t.reward.verifier == "suite:default" and t.task_source == "default" and t.split == "test" for t in stored)
    report = result.report
    assert list(report.modes) == ["instant", "auto"]
    assert all(r.trajectories == 2 and r.mean_cost_usd > 0 for r in report.modes.values())
    assert sum(report.modes["auto"].mode_share.values()) == pytest.approx(1.0)
    assert sorted(path.name for path in result.files) == ["accuracy_cost.png", "mode_share.png", "report.json", "report.md"]
    figures = json.loads((tmp_path / "report.json").read_text())
    assert figures["modes"]["instant"]["pass_at_1"] == report.modes["instant"].pass_at_1
