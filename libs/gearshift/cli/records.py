"""Reading what the store holds: trajectories and checkpoints; publishing a checkpoint; migrating
the store's database schema."""

from __future__ import annotations

import json
from pathlib import Path

import click

from gearshift.cli.common import store_call
from gearshift.cli.group import main
from gearshift.settings import get_settings


@main.group()
def trajectories() -> None:
    """Read stored trajectories."""


@trajectories.command("list")
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--mode", type=click.Choice(["instant", "reasoning", "agentic"]), default=None, show_default="every mode",
              help="Only this mode")
@click.option("--source", default="", show_default="every source", help="Only this task source")
@click.option("--wide", "-w", is_flag=True, help="Every column, full ids and times (also when the output is not a terminal)")
@click.option("--json", "as_json", is_flag=True, help="The trajectories as a JSON array (turns left out)")
def trajectories_list(limit: int, mode: str | None, source: str, wide: bool, as_json: bool) -> None:
    """List the newest trajectories. In a terminal the columns that fit it; ids are shortened
    as `trajectories show` accepts them."""
    from rich.console import Console

    from gearshift import console as view
    from gearshift.api.store.v1 import store_pb2
    from gearshift.tables import full_output, print_table

    query = store_pb2.QueryRequest(
        filter=store_pb2.TrajectoryFilter(modes=[view.MODE_BY_NAME[mode]] if mode else [], task_source=source), page_size=limit
    )
    page = store_call(lambda stub: stub.Query(query))
    if as_json:
        click.echo(json.dumps([view.as_dict(t) for t in page.trajectories], indent=2))
        return
    out = Console()
    full = full_output(out, wide)
    print_table(out, view.trajectories_table(list(page.trajectories), full), full)


PREFIX_SCAN = 5000  # a short id is looked up among this many of the newest trajectories


async def find_trajectory_id(stub, prefix: str) -> str:
    """The one id among the newest PREFIX_SCAN trajectories that starts with prefix."""
    from gearshift.api.store.v1 import store_pb2

    matches: set[str] = set()
    token, seen = "", 0
    while seen < PREFIX_SCAN and len(matches) < 2:
        page = await stub.Query(store_pb2.QueryRequest(page_size=min(500, PREFIX_SCAN - seen), page_token=token))
        matches.update(t.id for t in page.trajectories if t.id.startswith(prefix))
        seen, token = seen + len(page.trajectories), page.next_page_token
        if not token:
            break
    if not matches:
        raise click.ClickException(f"no trajectory among the newest {seen} has an id starting with {prefix!r}")
    if len(matches) > 1:
        raise click.ClickException(f"{prefix!r} starts more than one id ({', '.join(sorted(matches))}): give more of it")
    return matches.pop()


@trajectories.command("show", help="Show one trajectory: its transcript and its figures. TRAJECTORY_ID is its id, or the "
                      f"start of one (as `trajectories list` shortens them) among the newest {PREFIX_SCAN}.")
@click.argument("trajectory_id")
@click.option("--json", "as_json", is_flag=True, help="The whole trajectory as JSON")
def trajectories_show(trajectory_id: str, as_json: bool) -> None:
    import uuid

    from rich.console import Console

    from gearshift import console as view
    from gearshift.api.store.v1 import store_pb2
    from gearshift.protocol.a2fm import render_transcript

    async def get(stub):
        try:
            full_id = str(uuid.UUID(trajectory_id))
        except ValueError:
            full_id = await find_trajectory_id(stub, trajectory_id.lower())
        return (await stub.Get(store_pb2.GetRequest(id=full_id))).trajectory

    trajectory = store_call(get)
    if as_json:
        click.echo(view.as_json(trajectory))
        return
    out = Console()
    out.print(f"[bold]query[/] {trajectory.query}")
    out.print(render_transcript(trajectory), markup=False, highlight=False)
    out.print(view.summary(trajectory))


@main.group()
def checkpoints() -> None:
    """The checkpoint registry: policies and routers with their lineage and figures."""


@checkpoints.command("list")
@click.option("--kind", type=click.Choice(["policy", "router"]), default=None, show_default="both", help="Only this kind")
@click.option("--limit", type=int, default=20, show_default=True)
def checkpoints_list(kind: str | None, limit: int) -> None:
    """Checkpoints, newest first, with status and key figures."""
    from gearshift.api.common.v1.common_pb2 import CheckpointStatus
    from gearshift.api.store.v1 import store_pb2

    reply = store_call(lambda stub: stub.ListCheckpoints(store_pb2.ListCheckpointsRequest(kind=kind or "", limit=limit)))
    shown = ("accuracy", "cost_of_pass", "routing_accuracy", "learned_accuracy", "train/final_loss")
    for checkpoint in reply.checkpoints:
        status = CheckpointStatus.Name(checkpoint.status).removeprefix("CHECKPOINT_STATUS_")
        metrics = checkpoint.eval_metrics
        figures = ", ".join(f"{k} {metrics[k]:.3g}" for k in shown if k in metrics)
        click.echo(f"{checkpoint.id}  {checkpoint.kind:<6}  {status:<9}  {figures}")


@checkpoints.command("publish")
@click.argument("checkpoint_id")
def checkpoints_publish(checkpoint_id: str) -> None:
    """Make serving use a checkpoint: a policy through the configured publish target, a router
    through the registry (router services load it within their poll interval)."""
    from gearshift.cli.common import run_or_fail
    from gearshift.orchestration.task_bodies import publish

    click.echo(run_or_fail(publish(get_settings(), checkpoint_id)))


@main.command("publish-startup-adapters")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), required=True, help="File to write vLLM's arguments to")
def publish_startup_adapters(output: Path) -> None:
    """Write the --lora-modules that make a vLLM pod starting now serve the newest published
    adapter (the chart's init step; an empty file when there is none). A store that cannot be
    reached fails the step, so no pod starts on weights older than its peers'."""
    import shlex

    from gearshift.cli.common import run_or_fail
    from gearshift.orchestration.publishing import startup_lora_arguments

    arguments = run_or_fail(startup_lora_arguments(get_settings()))
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    partial.write_text(" ".join(shlex.quote(a) for a in arguments))
    partial.replace(output)
    click.echo(" ".join(arguments) or "no published adapter: the pod starts with its own arguments")


@main.command()
@click.option("--check", is_flag=True, help="Only say whether the schema is this version's; exit 1 when it is not")
def migrate(check: bool) -> None:
    """Bring the store's database (GEARSHIFT_DATABASE_URL, or the embedded SQLite file) to this
    version's schema: run before the services of a new version start (the chart's pre-upgrade
    Job). A database a newer version migrated is left alone, and the command fails."""
    from gearshift.cli.common import one_line_errors
    from gearshift.storage import check_schema, create_store_engine, upgrade_to_head

    engine = create_store_engine(get_settings().store_database_url(), pool_size=1)
    click.echo(f"database: {engine.url.render_as_string(hide_password=True)}")
    try:
        with one_line_errors():
            if check:
                click.echo(f"schema: {check_schema(engine).current} (current)")
                return
            before, after = upgrade_to_head(engine)
    finally:
        engine.dispose()
    click.echo(f"schema was: {before.current or 'empty'}")
    click.echo(f"schema now: {after.current}" + ("" if after != before else " (already current: nothing to do)"))
