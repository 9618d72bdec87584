"""Training: one job (`gearshift train JOB`) or one closed-loop round (`gearshift loop`)."""

from __future__ import annotations

import click

from gearshift.cli import main
from gearshift.cli.common import one_line_errors
from gearshift.settings import get_settings
from gearshift.training.jobs import JOB_NAMES, JOBS

JOB_LIST = "\n".join(f"  {job.name:<8} {job.summary}" for job in JOBS)


@main.command(help=f"Run a training job; writes a checkpoint directory with result.json.\n\n\b\n{JOB_LIST}")
@click.argument("job", type=click.Choice(JOB_NAMES))
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False), help="JSON or YAML job config")
def train(job: str, config_path: str) -> None:
    from gearshift.training.jobs import run_job, summary

    with one_line_errors():
        click.echo(summary(run_job(job, config_path)))


@main.command()
@click.option("--quick", is_flag=True, help="The test-sized round (a few items, a couple of steps) instead of the default")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None, help="JSON LoopConfig fields overriding the preset's")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Summary JSON (default: DATA_DIR/loop/ROUND_ID/summary.json)")
def loop(quick: bool, config_path: str | None, out: str | None) -> None:
    """One closed-loop round in this process: seed, score, SFT, APO, evaluate, gate, publish."""
    from gearshift.orchestration.loop import main as loop_main

    loop_main(get_settings(), quick, config_path, out)
