"""`gearshift router ...`: train, publish and list learned routers (imports stay lazy so the
main CLI starts fast)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click


@click.group()
def router() -> None:
    """Train and publish the learned cost-aware router."""


@router.command()
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A JSON or TOML file of RouterTrainingConfig fields (default: every default)")
def train(config_file: Path | None) -> None:
    """Train a router on stored forced-mode outcomes, evaluate it on held-out items, write and register it."""
    import grpc
    from pydantic import ValidationError

    from gearshift.jobs.router.config import RouterTrainingConfig
    from gearshift.jobs.router.trainer import NotEnoughData, RouterTrainer
    from gearshift.settings import get_settings

    try:
        config = RouterTrainingConfig.from_file(config_file) if config_file else RouterTrainingConfig()
        result = asyncio.run(RouterTrainer(config, get_settings()).run())
    except (ValidationError, NotEnoughData, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    except grpc.aio.AioRpcError as exc:
        raise click.ClickException(f"{exc.code().name}: {exc.details()}") from None
    if result.evaluation is not None:
        click.echo(result.evaluation.table())
    registered = "registered as a CANDIDATE checkpoint" if result.checkpoint is not None else "not registered"
    click.echo(f"router {result.version} written to {result.artefact_dir}, {registered}")


@router.command()
@click.argument("version")
def publish(version: str) -> None:
    """Mark router VERSION published: router services load it within their poll interval."""
    from gearshift.cli import store_call
    from gearshift.routing.registry import publish as publish_router

    checkpoint = store_call(lambda stub: publish_router(stub, version))
    click.echo(f"router {checkpoint.id} published ({checkpoint.uri})")


@router.command("list")
@click.option("--limit", type=int, default=20, show_default=True)
def list_(limit: int) -> None:
    """Router checkpoints, newest first, with status and key metrics."""
    from gearshift.common.v1.common_pb2 import CheckpointStatus
    from gearshift.cli import store_call
    from gearshift.routing.registry import list_routers

    for checkpoint in store_call(lambda stub: list_routers(stub, limit)):
        status = CheckpointStatus.Name(checkpoint.status).removeprefix("CHECKPOINT_STATUS_")
        metrics = checkpoint.eval_metrics
        figures = ", ".join(f"{k} {metrics[k]:.3g}" for k in ("routing_accuracy", "learned_accuracy", "learned_cost_of_pass_usd") if k in metrics)
        click.echo(f"{checkpoint.id}  {status:<9}  {figures}")
