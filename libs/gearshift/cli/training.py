"""Training: one job (`gearshift train JOB`) or one closed-loop round (`gearshift loop`)."""

from __future__ import annotations

import click

from gearshift.cli.common import one_line_errors
from gearshift.cli.group import main
from gearshift.job_table import JOB_NAMES, JOBS
from gearshift.settings import get_settings

JOB_LIST = "\n".join(f"  {job.name:<8} {job.summary}" for job in JOBS)


@main.command(help=f"Run a training job; writes a checkpoint directory with result.json.\n\n\b\n{JOB_LIST}")
@click.argument("job", type=click.Choice(JOB_NAMES))
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False), help="JSON or YAML job config")
def train(job: str, config_path: str) -> None:
    from gearshift.training.jobs import main_process, run_job, summary

    with one_line_errors():
        result = run_job(job, config_path)
    if main_process():
        click.echo(summary(result))


@main.command()
@click.option("--quick", is_flag=True, help="The test-sized round (a few items, a couple of steps) instead of the default")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None, show_default="the preset's", help="JSON LoopConfig fields overriding the preset's")
@click.option("--out", type=click.Path(dir_okay=False), default=None, show_default="DATA_DIR/loop/ROUND_ID/summary.json", help="Summary JSON")
@click.option("--from-feedback", is_flag=True, help="Learn from gateway traffic: SFT and APO on the served trajectories clients judged correct (POST /v1/feedback) instead of a seed run")
def loop(quick: bool, config_path: str | None, out: str | None, from_feedback: bool) -> None:
    """One closed-loop round in this process: seed, score, SFT, APO, evaluate, gate, publish (--from-feedback: SFT and APO on gateway traffic)."""
    import asyncio
    from pathlib import Path

    from rich.console import Console

    from gearshift.orchestration.loop import round_config, run_round

    with one_line_errors():
        config = round_config(quick, config_path, {"from_feedback": True} if from_feedback else {})
        asyncio.run(run_round(get_settings(), config, Console(), Path(out) if out else None))


@main.command()
@click.option("--suite", required=True, help="A registered suite or a .jsonl file")
@click.option("--split", type=click.Choice(["train", "dev"]), default="train", show_default=True, help="Never the held-out test split")
@click.option("--teachers", "teachers_file", required=True, type=click.Path(exists=True, dir_okay=False), help="YAML: the teachers and what they teach")
@click.option("--modes", default="instant,reasoning,agentic", show_default=True, help="Comma-separated forced modes")
@click.option("--n", "n", type=int, default=None, show_default="all of a finite suite", help="Items of the split")
@click.option("--run-id", default=None, show_default="teach-SUITE", help="Resume or name the runs; each teacher and mode is RUN_ID-TEACHER-MODE")
@click.option("--concurrency", type=int, default=4, show_default=True, help="Episodes in flight at once per teacher")
@click.option("--inprocess", is_flag=True, help="Start the store, sandbox and reward service in this process")
def teach(suite: str, split: str, teachers_file: str, modes: str, n: int | None, run_id: str | None, concurrency: int, inprocess: bool) -> None:
    """Teachers solve a suite's training items through the executor; their trajectories are stored as training data."""
    import contextlib

    from rich.console import Console

    from gearshift.cli.common import run_or_fail
    from gearshift.embedded import embedded
    from gearshift.evaluation.runner import parse_modes
    from gearshift.evaluation.suites import suite_name
    from gearshift.teaching.teach import TeachersConfig, teach as run_teachers

    settings, out = get_settings(), Console()
    with one_line_errors():
        config = TeachersConfig.from_file(teachers_file)
        chosen = [m for m in parse_modes(modes) if m not in ("auto", "learned")]
    run_id = run_id or f"teach-{suite_name(suite)}"

    async def go():
        async with contextlib.AsyncExitStack() as stack:
            target = settings
            if inprocess:
                target = (await stack.enter_async_context(embedded(settings, ("store", "sandbox", "reward")))).settings
            return await run_teachers(target, suite, split, config, chosen, n, run_id, concurrency, out)

    done = run_or_fail(go())
    for teacher, by_mode in done.items():
        for mode, evaluation in by_mode.items():
            figures = evaluation.report.modes[mode]
            out.print(f"{teacher:<20} {mode:<9} {figures.correct}/{figures.trajectories} correct  run {evaluation.summary.run_id}")


@main.group("default-policy")
def default_policy() -> None:
    """The embedded default policy: SmolLM2-135M with a LoRA adapter the platform trains itself."""


@default_policy.command("build")
@click.option("--work-dir", type=click.Path(file_okay=False), default=None, show_default="DATA_DIR/default-policy", help="Where teaching data, runs and the store go")
@click.option("--ship-to", type=click.Path(file_okay=False), default=None, show_default="the package's gearshift/default_policy", help="Where the adapter goes")
def default_policy_build(work_dir: str | None, ship_to: str | None) -> None:
    """Teach, train (route-then-align SFT, LoRA), register and ship the default policy, from a fixed seed."""
    import json
    from pathlib import Path

    from rich.console import Console

    from gearshift import weights
    from gearshift.teaching.default_policy import Recipe, build

    settings = get_settings()
    with one_line_errors():
        card = build(settings, Recipe(), Path(work_dir) if work_dir else settings.data_dir / "default-policy",
                     Path(ship_to) if ship_to else weights.DEFAULT_ADAPTER, Console())
    click.echo(json.dumps(card, indent=2, default=str))


@default_policy.command("figures")
@click.option("--base", "base_runs", required=True, help="Evaluation runs of the base model, comma-separated (gearshift eval --run-id)")
@click.option("--trained", "trained_runs", required=True, help="The same items evaluated with the default policy, comma-separated")
@click.option("--out", type=click.Path(dir_okay=False), default=None, show_default="none: only printed", help="Also write the Markdown table here")
def default_policy_figures(base_runs: str, trained_runs: str, out: str | None) -> None:
    """Base against trained per family and mode: protocol validity, tool calls, accuracy, modes picked; the goals."""
    from pathlib import Path

    from gearshift.api.store.v1 import store_pb2_grpc
    from gearshift.cli.common import run_or_fail
    from gearshift.clients import channel
    from gearshift.embedded import embedded
    from gearshift.evaluation.report import fetch_run
    from gearshift.teaching.figures import figures, markdown

    settings = get_settings()

    async def read(store, runs: str):
        episodes = [t for run in runs.split(",") for t in await fetch_run(store, run.strip())]
        if not episodes:
            raise click.ClickException(f"no stored episodes in run(s) {runs}")
        return figures(episodes)

    async def go():  # a store of its own on the configured database
        async with embedded(settings, ("store",)) as platform, channel(platform.settings.store_addr, platform.settings) as ch:
            store = store_pb2_grpc.TrajectoryStoreStub(ch)
            return await read(store, base_runs), await read(store, trained_runs)

    table = markdown(*run_or_fail(go()))
    click.echo(table)
    if out:
        Path(out).write_text(table)
