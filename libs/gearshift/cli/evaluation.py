"""`gearshift eval`: run a suite through the executor, compare runs, rewrite a report."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import click
from rich.console import Console

from gearshift.cli.common import one_line_errors, run_or_fail
from gearshift.cli.group import main
from gearshift.settings import get_settings
from gearshift.tables import full_output, print_table


@main.group("eval", invoke_without_command=True)
@click.option("--suite", default="default", show_default=True, help="A registered suite or a .jsonl file")
@click.option("--modes", default="instant,reasoning,agentic,auto", show_default=True, help="Comma-separated: instant, reasoning, agentic, auto, learned")
@click.option("--n", "n", type=int, default=20, show_default=True, help="Items of the split to run")
@click.option("--samples", type=int, default=1, show_default=True, help="Samples per item and mode (k of pass@k)")
@click.option("--split", type=click.Choice(["train", "dev", "test"]), default="test", show_default=True)
@click.option("--run-id", default=None, show_default="SUITE-TIMESTAMP", help="Resume or name a run")
@click.option("--concurrency", type=int, default=4, show_default=True, help="Episodes in flight at once")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, show_default="DATA_DIR/eval/RUN_ID", help="Report folder")
@click.option("--inprocess", is_flag=True, help="Start the services and the built-in policy server in this process")
@click.option("--wide", "-w", is_flag=True, help="Every column of the table, however narrow the terminal")
@click.pass_context
def eval_(ctx, suite, modes, n, samples, split, run_id, concurrency, out_dir, inprocess, wide) -> None:
    """Evaluate modes on a suite through the executor; writes a Markdown/PNG report."""
    if ctx.invoked_subcommand is not None:
        return
    from gearshift.embedded import embedded
    from gearshift.evaluation.harness import default_run_id, evaluate
    from gearshift.evaluation.report import summary_table
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
    print_table(out, summary_table(result.report), full_output(out, wide))
    if result.report.failed:
        out.print(f"left out of the figures (failed episodes, run again on resume): {result.report.failed}")
    out.print("report: " + ", ".join(str(path) for path in result.files))


@eval_.command("compare")
@click.argument("run_a")
@click.argument("run_b")
@click.option("--wide", "-w", is_flag=True, help="Every column of the table, however narrow the terminal")
def eval_compare(run_a: str, run_b: str, wide: bool) -> None:
    """Show per-mode differences of run B against run A."""
    from gearshift.evaluation.harness import load_report
    from gearshift.evaluation.report import compare_table

    settings = get_settings()

    async def go():
        return await load_report(settings, run_a), await load_report(settings, run_b)

    a, b = run_or_fail(go())
    out = Console()
    print_table(out, compare_table(a, b), full_output(out, wide))


@eval_.command("report")
@click.argument("run_id")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, show_default="DATA_DIR/eval/RUN_ID", help="Report folder")
@click.option("--wide", "-w", is_flag=True, help="Every column of the table, however narrow the terminal")
def eval_report(run_id: str, out_dir: str | None, wide: bool) -> None:
    """Recompute and rewrite a stored run's report."""
    from gearshift.evaluation.harness import load_report
    from gearshift.evaluation.report import summary_table, write_report

    settings = get_settings()
    report = run_or_fail(load_report(settings, run_id))
    files = write_report(report, Path(out_dir) if out_dir else settings.data_dir / "eval" / run_id)
    out = Console()
    print_table(out, summary_table(report), full_output(out, wide))
    out.print("report: " + ", ".join(str(path) for path in files))


@eval_.command("headline")
@click.option("--suite", default="headline", show_default=True,
              help="A registered suite, or a .jsonl file (each row's family, else its domain, is its family)")
@click.option("--n-per-family", type=int, default=60, show_default=True, help="Test items per family")
@click.option("--train-n", type=int, default=15, show_default=True, help="Train items per family the learned router learns from")
@click.option("--modes", default="instant,reasoning,agentic,auto,learned", show_default=True,
              help="Comma-separated; without learned no router is trained (e.g. instant,auto for a candidate checkpoint)")
@click.option("--run-id", default=None, show_default="headline-TIMESTAMP", help="Resume or name the run; the train run is RUN_ID-train")
@click.option("--concurrency", type=int, default=4, show_default=True, help="Episodes in flight at once")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, show_default="DATA_DIR/headline/RUN_ID", help="Report folder")
@click.option("--inprocess", is_flag=True, help="Start the services and the built-in policy server in this process")
@click.option("--model", default=None, show_default="GEARSHIFT_POLICY_SERVER__MODEL, else default", help="With --inprocess: the policy to serve (smollm2, default, tiny, a directory or a checkpoint id)")
@click.option("--router-embedding", type=click.Choice(["static", "minilm", "none"]), default="static", show_default=True,
              help="The learned router's query embedding")
@click.option("--bootstrap", "bootstrap_samples", type=int, default=2000, show_default=True, help="Bootstrap resamples per interval")
def eval_headline(suite, n_per_family, train_n, modes, run_id, concurrency, out_dir, inprocess, model, router_embedding,
                  bootstrap_samples) -> None:
    """The headline measurement: forced modes, auto and the learned router on the same test items; one report."""
    from gearshift.embedded import embedded
    from gearshift.evaluation.harness import default_run_id
    from gearshift.evaluation.headline import HeadlinePlan, resolve_model, run_headline
    from gearshift.evaluation.runner import parse_modes
    from gearshift.evaluation.suites import get_suite

    if model and not inprocess:
        raise click.UsageError("--model needs --inprocess (a running stack serves the policy it was started with)")
    if bootstrap_samples < 1 or concurrency < 1:
        raise click.BadParameter("--bootstrap and --concurrency must be positive")
    settings, out = get_settings(), Console()
    with one_line_errors():
        plan = HeadlinePlan(run_id or default_run_id(suite), suite, n_per_family, train_n, tuple(parse_modes(modes)), concurrency,
                            router_embedding, bootstrap_samples)
        get_suite(suite).items_per_family("test", n_per_family)  # refuse a family too small before starting anything
    folder = Path(out_dir) if out_dir else settings.data_dir / "headline" / plan.run_id
    out.print(f"run [bold]{plan.run_id}[/] (resume with --run-id {plan.run_id})")

    async def go():
        if not inprocess:
            return await run_headline(settings, plan, folder, out)
        policy = settings.policy_server.model
        if model:
            async with embedded(settings, ("store",)) as probe:
                policy = await resolve_model(probe.settings, model)
        async with embedded(settings, policy_model=policy) as platform:
            return await run_headline(platform.settings, dataclasses.replace(plan, policy_weights=policy), folder, out)

    result = run_or_fail(go())
    for error in result.errors[:5]:
        out.print(f"[red]error[/] {error}", markup=True, highlight=False)
    out.print(f"goal {'MET' if result.report.goal_met else 'not met'}")
    for check in result.report.checks():
        out.print(f"  {check.mode}: " + "; ".join(check.reasons), highlight=False)
    out.print("report: " + ", ".join(str(path) for path in result.files))


@eval_.command("before-after")
@click.argument("before_run")
@click.argument("after_run")
@click.option("--mode", type=click.Choice(["auto", "learned", "instant", "reasoning", "agentic"]), default="auto", show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, show_default="DATA_DIR/headline/AFTER_RUN", help="Folder")
@click.option("--bootstrap", "bootstrap_samples", type=int, default=2000, show_default=True, help="Bootstrap resamples per interval")
def eval_before_after(before_run: str, after_run: str, mode: str, out_dir: str | None, bootstrap_samples: int) -> None:
    """Compare two runs on the same items with paired intervals (e.g. the base and its APO checkpoint)."""
    from gearshift.api.store.v1 import store_pb2_grpc
    from gearshift.clients import channel
    from gearshift.evaluation.before_after import compare_runs, markdown, write_before_after
    from gearshift.evaluation.report import fetch_run

    settings = get_settings()

    async def go():
        async with channel(settings.store_addr, settings) as ch:
            stub = store_pb2_grpc.TrajectoryStoreStub(ch)
            return await fetch_run(stub, before_run), await fetch_run(stub, after_run)

    before, after = run_or_fail(go())
    with one_line_errors():
        result = compare_runs(before, after, before_run, after_run, mode, bootstrap_samples)
    paths = write_before_after(result, Path(out_dir) if out_dir else settings.data_dir / "headline" / after_run)
    click.echo(markdown(result))
    click.echo("written: " + ", ".join(str(p) for p in paths))
