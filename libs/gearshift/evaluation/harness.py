"""The evaluation harness end to end: open channels to the executor and the store, run the suite,
build the report from the store and write it. The stack is whatever the settings point at: a
running one, or one started in this process with gearshift.embedded."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from gearshift.api.common.v1.common_pb2 import Purpose, Sampling
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.api.store.v1 import store_pb2_grpc
from gearshift.clients import channel
from gearshift.evaluation.report import RunReport, build_report, fetch_run, write_report
from gearshift.evaluation.runner import EvalRunner, RunSummary
from gearshift.evaluation.suites import SuiteItem, get_suite
from gearshift.settings import Settings


@dataclass
class Evaluation:
    """What one `gearshift eval` did: the run summary, its report and the files written."""

    summary: RunSummary
    report: RunReport
    files: list[Path]


def default_run_id(suite: str) -> str:
    return f"{Path(suite).stem}-{time.strftime('%Y%m%d-%H%M%S')}"


async def evaluate(
    settings: Settings,
    suite_name: str,
    modes: list[str],
    n: int | None,
    samples: int = 1,
    split: str = "test",
    run_id: str | None = None,
    concurrency: int = 4,
    out_dir: str | Path | None = None,
    budget: executor_pb2.Budget | None = None,
    console: Console | None = None,
    executor=None,
    purpose: int = Purpose.PURPOSE_EVALUATION,
    sampling: Sampling | None = None,
    items: list[SuiteItem] | None = None,
) -> Evaluation:
    """Runs (or resumes) a suite against the stack `settings` points at, then reports it.
    Trajectories are stored with `purpose` (evaluation unless the run makes training data or
    serves the promotion gate). `items` narrows the split's first n items to a chosen few.

    `executor` replaces the executor stub (tests count its Solve calls through a wrapper)."""
    suite = get_suite(suite_name)
    run_id = run_id or default_run_id(suite.name)
    items = suite.items(split, n) if items is None else items
    if not items:
        raise ValueError(f"suite {suite.name!r} has no {split} items")
    async with channel(settings.executor_addr, settings) as executor_channel, channel(settings.store_addr, settings) as store_channel:
        store = store_pb2_grpc.TrajectoryStoreStub(store_channel)
        runner = EvalRunner(executor or executor_pb2_grpc.ExecutorStub(executor_channel), store, suite, run_id,
                            concurrency, budget, console, purpose, sampling)
        summary = await runner.run(items, modes, samples)
        report = build_report(await fetch_run(store, run_id), run_id)
    files = write_report(report, Path(out_dir) if out_dir else settings.data_dir / "eval" / run_id)
    return Evaluation(summary, report, files)


async def load_report(settings: Settings, run_id: str) -> RunReport:
    """A stored run's report, recomputed from the store."""
    async with channel(settings.store_addr, settings) as store_channel:
        return build_report(await fetch_run(store_pb2_grpc.TrajectoryStoreStub(store_channel), run_id), run_id)
