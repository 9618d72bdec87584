"""`gearshift eval`: run a suite through the executor, compare runs, rewrite a report."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click
from rich.console import Console

from gearshift.cli import main
from gearshift.cli.common import run_or_fail
from gearshift.settings import get_settings


@main.group("eval", invoke_without_command=True)
@click.option("--suite", default="default", show_default=True, help="A registered suite or a .jsonl file")
@click.option("--modes", default="instant,reasoning,agentic,auto", show_default=True, help="Comma-separated: instant, reasoning, agentic, auto, learned")
@click.option("--n", "n", type=int, default=20, show_default=True, help="Items of the split to run")
@click.option("--samples", type=int, default=1, show_default=True, help="Samples per item and mode (k of pass@k)")
@click.option("--split", type=click.Choice(["train", "dev", "test"]), default="test", show_default=True)
@click.option("--run-id", default=None, help="Resume or name a run (default: SUITE-TIMESTAMP)")
@click.option("--concurrency", type=int, default=4, show_default=True, help="Episodes in flight at once")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, help="Report folder (default: DATA_DIR/eval/RUN_ID)")
@click.option("--inprocess", is_flag=True, help="Start the services and the built-in policy server in this process")
@click.pass_context
def eval_(ctx, suite, modes, n, samples, split, run_id, concurrency, out_dir, inprocess) -> None:
    """Evaluate modes on a suite through the executor; writes a Markdown/PNG report."""
    if ctx.invoked_subcommand is not None:
        return
    from gearshift.embedded import embedded
    from gearshift.evaluation.harness import default_run_id, evaluate
    from gearshift.evaluation.report import rich_table
    from gearshift.evaluation.runner import parse_modes

    if n < 1 or samples < 1:
        raise click.BadParameter("--n and --samples must be positive")
    try:
        chosen = parse_modes(modes)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--modes") from None
    settings, out = get_settings(), Console()
    run_id = run_id or default_run_id(suite)
    out.print(f"run [bold]{run_id}[/] (resume with --run-id {run_id})")

    async def go():
        async with contextlib.AsyncExitStack() as stack:
            target = settings
            if inprocess:
                target = (await stack.enter_async_context(embedded(settings, policy_model=settings.policy_server.model))).settings
            return await evaluate(target, suite, chosen, n, samples, split, run_id, concurrency, out_dir, console=out)

    result = run_or_fail(go())
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


@eval_.command("compare")
@click.argument("run_a")
@click.argument("run_b")
def eval_compare(run_a: str, run_b: str) -> None:
    """Show per-mode differences of run B against run A."""
    from gearshift.evaluation.harness import load_report
    from gearshift.evaluation.report import compare_table

    settings = get_settings()

    async def go():
        return await load_report(settings, run_a), await load_report(settings, run_b)

    a, b = run_or_fail(go())
    Console().print(compare_table(a, b))


@eval_.command("report")
@click.argument("run_id")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, help="Report folder (default: DATA_DIR/eval/RUN_ID)")
def eval_report(run_id: str, out_dir: str | None) -> None:
    """Recompute and rewrite a stored run's report."""
    from gearshift.evaluation.harness import load_report
    from gearshift.evaluation.report import rich_table, write_report

    settings = get_settings()
    report = run_or_fail(load_report(settings, run_id))
    files = write_report(report, Path(out_dir) if out_dir else settings.data_dir / "eval" / run_id)
    out = Console()
    out.print(rich_table(report))
    out.print("report: " + ", ".join(str(path) for path in files))
