"""The gearshift command line: serve one service, bring the embedded stack up, check health."""

from __future__ import annotations

import asyncio
import importlib
import sys

import click

from gearshift.settings import SERVICES, get_settings


def serve_service(name: str, port: int | None = None) -> None:
    """Runs one service in this process until SIGTERM/SIGINT."""
    from gearshift.server import configure_logging, serve

    settings = get_settings()
    if port is not None:
        settings = settings.model_copy(update={"port": port})
    configure_logging(settings.log_level)
    module = importlib.import_module(f"gearshift.services.{name}.service")
    asyncio.run(serve(module.build, settings))


@click.group()
def main() -> None:
    """gearshift: an adaptive agent platform."""


@main.command()
@click.argument("service", type=click.Choice(SERVICES))
@click.option("--port", type=int, default=None, help="gRPC port (default: GEARSHIFT_PORT or the service's own)")
def serve(service: str, port: int | None) -> None:
    """Run one service in the foreground."""
    serve_service(service, port)


@main.command("serve-policy")
@click.option("--model", default=None, help='"smollm2", "tiny" or a local checkpoint directory (default: GEARSHIFT_POLICY__MODEL)')
@click.option("--port", type=int, default=None, help="HTTP port (default: GEARSHIFT_POLICY__PORT, 8400)")
def serve_policy(model: str | None, port: int | None) -> None:
    """Run the built-in OpenAI-compatible policy server in the foreground."""
    from gearshift.services.policy_server.server import main as serve_policy_main

    serve_policy_main(model, port)


@main.command()
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, help="Where the SQLite store lives")
@click.option("--base-port", type=int, default=None, help="First of six consecutive gRPC ports")
@click.option("--no-policy", is_flag=True, help="Do not start the built-in policy server")
def up(data_dir: str | None, base_port: int | None, no_policy: bool) -> None:
    """Start every service on localhost; Ctrl-C stops them all."""
    from gearshift.stack import Stack

    settings = get_settings()
    stack = Stack(settings, data_dir=data_dir, base_port=base_port, with_policy=not no_policy)
    sys.exit(stack.run_foreground())


@main.command()
@click.option("--timeout", type=float, default=2.0, help="Seconds to wait for each service")
def status(timeout: float) -> None:
    """Check each service's gRPC health."""
    from gearshift.stack import check_health

    results = asyncio.run(check_health(get_settings(), timeout))
    width = max(map(len, results))
    for name, (address, state) in results.items():
        click.echo(f"{name:<{width}}  {address:<22} {state}")
    sys.exit(0 if all(state == "SERVING" for _, state in results.values()) else 1)


@main.group()
def corpus() -> None:
    """Manage the sandbox's search corpus."""


@corpus.command("add")
@click.argument("path", type=click.Path(exists=True))
def corpus_add(path: str) -> None:
    """Ingest a text, Markdown or JSONL file (or a folder of them) into the corpus."""
    from gearshift.services.sandbox.corpus import CorpusError, ingest

    try:
        click.echo(ingest(path, get_settings()))
    except CorpusError as exc:
        raise click.ClickException(str(exc)) from exc


if __name__ == "__main__":
    main()
