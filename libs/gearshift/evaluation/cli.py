"""What `gearshift eval` does; the click declarations stay in gearshift.cli."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click
import grpc
from rich.console import Console

from gearshift.evaluation.harness import default_run_id, evaluate, load_report, stack_for
from gearshift.evaluation.report import compare_table, rich_table, write_report
from gearshift.evaluation.runner import parse_modes
from gearshift.settings import Settings


def _errors_to_click(run):
    try:
        return asyncio.run(run)
    except grpc.aio.AioRpcError as exc:
        raise click.ClickException(f"{exc.code().name}: {exc.details()}") from None
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


def run_eval(settings: Settings, suite: str, modes: str, n: int, samples: int, split: str, run_id: str | None,
             concurrency: int, out_dir: str | None, inprocess: bool) -> None:
    if n < 1 or samples < 1:
        raise click.BadParameter("--n and --samples must be positive")
    try:
        chosen = parse_modes(modes)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--modes") from None
    out = Console()
    run_id = run_id or default_run_id(suite)
    out.print(f"run [bold]{run_id}[/] (resume with --run-id {run_id})")

    async def go():
        async with stack_for(settings, inprocess) as running:
            return await evaluate(running, suite, chosen, n, samples, split, run_id, concurrency, out_dir, console=out)

    result = _errors_to_click(go())
    summary = result.summary
    out.print(f"{summary.planned} episodes: {summary.solved} solved now, {summary.skipped} already stored, {len(summary.errors)} errors")
    for error in summary.errors[:5]:
        out.print(f"[red]error[/] {error}", markup=True, highlight=False)
    if summary.aborted:
        out.print(f"[red]stopped early[/]: the stack became unavailable; resume with --run-id {run_id}")
    out.print(rich_table(result.report))
    if result.report.failed:
        out.print(f"left out of the figures (failed episodes, run again on resume): {result.report.failed}")
    out.print("report: " + ", ".join(str(path) for path in result.files))


def run_compare(settings: Settings, run_a: str, run_b: str) -> None:
    async def go():
        return await load_report(settings, run_a), await load_report(settings, run_b)

    a, b = _errors_to_click(go())
    Console().print(compare_table(a, b))


def run_report(settings: Settings, run_id: str, out_dir: str | None) -> None:
    report = _errors_to_click(load_report(settings, run_id))
    files = write_report(report, Path(out_dir) if out_dir else settings.data_dir / "eval" / run_id)
    out = Console()
    out.print(rich_table(report))
    out.print("report: " + ", ".join(str(path) for path in files))
