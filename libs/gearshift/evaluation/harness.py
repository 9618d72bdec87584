"""The evaluation harness end to end: open channels to the executor and the store, run the suite,
build the report from the store and write it. `stack_for` optionally brings the whole platform
up in this process (tests, benchmarks, one-off runs without `gearshift up`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from gearshift.clients import channel
from gearshift.evaluation.report import RunReport, build_report, fetch_run, write_report
from gearshift.evaluation.runner import EvalRunner, RunSummary
from gearshift.evaluation.suites import get_suite
from gearshift.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.settings import Settings
from gearshift.store.v1 import store_pb2_grpc


@dataclass
class Evaluation:
    """What one `gearshift eval` did: the run summary, its report and the files written."""

    summary: RunSummary
    report: RunReport
    files: list[Path]


def default_run_id(suite: str) -> str:
    return f"{Path(suite).stem}-{time.strftime('%Y%m%d-%H%M%S')}"


@contextlib.asynccontextmanager
async def stack_for(settings: Settings, inprocess: bool, builtin_policy: bool = True) -> AsyncIterator[Settings]:
    """Settings pointing at a running stack: the configured one, or one started in this process
    (with the built-in policy server on a free port unless builtin_policy is False)."""
    if not inprocess:
        yield settings
        return
    from gearshift.testing.stack import inprocess_stack

    async with contextlib.AsyncExitStack() as stack:
        if builtin_policy:
            from gearshift.services.policy_server.server import running

            policy = await stack.enter_async_context(
                running(settings.model_copy(update={"policy": settings.policy.model_copy(update={"port": 0})}))
            )
            settings = settings.model_copy(update={"policy_url": policy.base_url})
        yield await stack.enter_async_context(inprocess_stack(settings))


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
) -> Evaluation:
    """Runs (or resumes) a suite against the stack `settings` points at, then reports it.

    `executor` replaces the executor stub (tests count its Solve calls through a wrapper)."""
    suite = get_suite(suite_name)
    run_id = run_id or default_run_id(suite.name)
    items = suite.items(split, n)
    if not items:
        raise ValueError(f"suite {suite.name!r} has no {split} items")
    async with channel(settings.executor_addr, settings) as executor_channel, channel(settings.store_addr, settings) as store_channel:
        store = store_pb2_grpc.TrajectoryStoreStub(store_channel)
        runner = EvalRunner(executor or executor_pb2_grpc.ExecutorStub(executor_channel), store, suite, run_id,
                            concurrency, budget, console)
        summary = await runner.run(items, modes, samples)
        report = build_report(await fetch_run(store, run_id), run_id)
    files = write_report(report, Path(out_dir) if out_dir else settings.data_dir / "eval" / run_id)
    return Evaluation(summary, report, files)


async def load_report(settings: Settings, run_id: str) -> RunReport:
    """A stored run's report, recomputed from the store."""
    async with channel(settings.store_addr, settings) as store_channel:
        return build_report(await fetch_run(store_pb2_grpc.TrajectoryStoreStub(store_channel), run_id), run_id)
