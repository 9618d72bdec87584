"""Running the platform: one service, the policy server, the whole embedded stack, its health,
the demo, and solving a question."""

from __future__ import annotations

import asyncio
import importlib
import sys

import click

from gearshift.cli.common import run_or_fail
from gearshift.cli.group import main
from gearshift.settings import Settings, get_settings
from gearshift.topology import BY_NAME, PORT_ORDER, SERVICE_NAMES, describe_base_port

DATA_DIR_OPTION = click.option("--data-dir", type=click.Path(file_okay=False), default=None, show_default="GEARSHIFT_DATA_DIR, ~/.gearshift",
                               help="Where the SQLite store (and, for up, stack.json) lives")
BASE_PORT_OPTION = click.option(
    "--base-port", type=int, default=None, show_default="the default layout: router 50051 ... store 50056, gateway 8100, policy 8400",
    help=f"First of {len(PORT_ORDER)} consecutive ports, in the default layout's order: {describe_base_port()} "
    "(a gRPC service's metrics on its port + 1000)")


@main.command()
@click.argument("service", type=click.Choice(SERVICE_NAMES))
@click.option("--port", type=int, default=None, show_default="GEARSHIFT_PORT, else the service's own", help="Port")
def serve(service: str, port: int | None) -> None:
    """Run one service in the foreground until SIGTERM/SIGINT."""
    settings = get_settings()
    if port is not None:
        settings = settings.model_copy(update={"port": port})
    spec = BY_NAME[service]
    importlib.import_module(spec.bootstrap).main(importlib.import_module(spec.module).build, settings)


@main.command("serve-policy")
@click.option("--model", default=None, show_default="GEARSHIFT_POLICY_SERVER__MODEL, else default",
              help='"default" (the default policy: SmolLM2 with the shipped adapter), "smollm2" (its base), "tiny" '
              "(random weights, for tests) or a local checkpoint or adapter directory")
@click.option("--port", type=int, default=None, show_default="GEARSHIFT_POLICY_SERVER__PORT, else 8400", help="HTTP port")
def serve_policy(model: str | None, port: int | None) -> None:
    """Run the built-in OpenAI-compatible policy server in the foreground."""
    from gearshift.services.policy_server.server import main as serve_policy_main

    serve_policy_main(model, port)


@main.command()
@DATA_DIR_OPTION
@BASE_PORT_OPTION
@click.option("--no-policy", is_flag=True, help="Do not start the built-in policy server (the services call GEARSHIFT_POLICY_CLIENT__URL)")
@click.option("--loop", is_flag=True, help="Also start a Celery worker and beat for the training loop, if Redis (GEARSHIFT_REDIS_URL) answers")
def up(data_dir: str | None, base_port: int | None, no_policy: bool, loop: bool) -> None:
    """Start every service on localhost (and the loop's worker and beat); Ctrl-C stops them all,
    callers first.

    While it serves, DATA_DIR/stack.json says where, and the other commands (status, solve,
    trajectories, ...) run with the same data directory (GEARSHIFT_DATA_DIR) find it there:
    no address to set, whatever --base-port. A GEARSHIFT_*_ADDR variable, where set, wins."""
    from gearshift.stack import Stack

    stack = Stack(get_settings(), data_dir=data_dir, base_port=base_port, with_policy=not no_policy, with_loop=loop)
    sys.exit(stack.run_foreground())


@main.command()
@click.option("--timeout", type=float, default=2.0, help="Seconds to wait for each service")
def status(timeout: float) -> None:
    """Check each service's health (gRPC health, the gateway's /ready) and the policy server's,
    at the running `gearshift up`'s addresses (its stack.json) or the GEARSHIFT_*_ADDR ones."""
    from gearshift.stack import STACK_FILE, check_health, policy_health, read_stack_file

    settings = get_settings()
    running = read_stack_file(settings.data_dir)
    if running:
        click.echo(f"gearshift up (pid {running['pid']}) serves from {settings.data_dir / STACK_FILE}")
    results = asyncio.run(check_health(settings, timeout))
    results["policy"] = (settings.policy_client.url, policy_health(settings.policy_client.url, settings))
    width = max(map(len, results))
    for name, (address, state) in results.items():
        click.echo(f"{name:<{width}}  {address:<22} {state}")
    if not any(state == "SERVING" for _, state in results.values()):
        click.echo(f"nothing answers: {'its services are down' if running else 'no gearshift up serves from ' + str(settings.data_dir)}; "
                   "start the platform with `gearshift up` (other commands then find it), or set GEARSHIFT_DATA_DIR to the "
                   "one it runs from, or GEARSHIFT_*_ADDR to where each service serves", err=True)
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


@main.command()
@click.argument("question")
@click.option("--mode", type=click.Choice(["auto", "instant", "reasoning", "agentic"]), default="auto", show_default=True)
@click.option("--reference", default="", show_default="none: not scored", help="Reference answer; the trajectory is then scored")
@click.option("--max-steps", type=int, default=0, help="Turn budget (0: the mode's default)")
@click.option("--json", "as_json", is_flag=True, help="Print the stored trajectory as JSON instead of the live view")
def solve(question: str, mode: str, reference: str, max_steps: int, as_json: bool) -> None:
    """Answer a question through the executor, showing mode, plan, tool calls and answer live."""
    from rich.console import Console

    from gearshift import console as view
    from gearshift.api.executor.v1 import executor_pb2

    request = executor_pb2.SolveRequest(
        query=question, mode=view.MODE_BY_NAME[mode], reference_answer=reference, budget=executor_pb2.Budget(max_steps=max_steps)
    )
    out = Console()
    trajectory = run_or_fail(view.solve(get_settings(), request, None if as_json else view.LiveView(out)))
    if as_json:
        click.echo(view.as_json(trajectory))
    else:
        out.print(view.summary(trajectory))
        out.print(f"trajectory {trajectory.id}")


# Questions of no training set (tests/libs/teaching checks), each with the mode one would expect
# the policy to choose by itself: a fact directly, a large product with python, a word problem
# by reasoning.
DEMO_QUESTIONS = (
    ("What is the capital of France?", "Paris", "instant"),
    ("What is 48213 * 7719?", "372156147", "agentic"),
    # One step: the 135M default policy reasons its way through these, not through multi-step
    # ones (its gsm_symbolic accuracy is in docs/results/headline.md).
    ("Mia had 20 stickers and gave 6 to her friend. How many stickers does she have left?", "14", "reasoning"),
)


@main.command()
@DATA_DIR_OPTION
@BASE_PORT_OPTION
def demo(data_dir: str | None, base_port: int | None) -> None:
    """Start the embedded stack, solve a few example questions live, ask one through the gateway, then stop it."""
    from rich.console import Console

    from gearshift import console as view
    from gearshift.api.executor.v1 import executor_pb2
    from gearshift.stack import Stack

    out = Console()
    settings = get_settings()
    stack = Stack(settings.model_copy(update={"log_level": "WARNING"}), data_dir=data_dir, base_port=base_port)
    out.print(f"starting the stack with the {settings.policy_server.model} policy ...")
    stack.start()
    try:
        try:
            results = stack.wait_ready()
        except RuntimeError as exc:  # a service exited: it logged why
            raise click.ClickException(str(exc)) from None
        down = [name for name, (_, state) in results.items() if state != "SERVING"]
        if down:
            raise click.ClickException(f"not ready: {', '.join(down)}")
        for question, reference, expected in DEMO_QUESTIONS:
            out.rule()
            out.print(f"[bold]{question}[/]  [dim](reference {reference}; one would expect {expected} mode)[/]")
            request = executor_pb2.SolveRequest(query=question, reference_answer=reference)
            trajectory = asyncio.run(view.solve(stack.client_settings(), request, view.LiveView(out)))
            out.print(view.summary(trajectory))
        out.rule()
        ask_the_gateway(stack.client_settings(), out)
        out.rule()
        out.print(f"stored in {stack.data_dir / 'store.db'}: `gearshift trajectories list` reads them")
    finally:
        stack.stop()


def ask_the_gateway(settings: Settings, out) -> None:
    """The demo's first question again, through the OpenAI-compatible gateway with the official
    openai client (the dev extra, which `make install` installs): the answer, and the mode and
    cost from the reply's `gearshift` extension object."""
    import httpx
    from rich.markup import escape

    from gearshift import tls

    try:
        import openai
    except ImportError:
        out.print("[dim]pip install openai to see the same stack answer through its OpenAI-compatible gateway[/]")
        return
    question = DEMO_QUESTIONS[0][0]
    client = openai.OpenAI(base_url=f"{tls.scheme(settings.tls)}://{settings.gateway_addr}/v1", api_key=settings.token() or "no-token-set",
                           max_retries=0, timeout=600, http_client=httpx.Client(verify=tls.client_context(settings.tls) or True))
    out.print(f"[bold]{question}[/]  [dim](the openai client at {client.base_url}, model gearshift)[/]")
    try:
        reply = client.chat.completions.create(model="gearshift", messages=[{"role": "user", "content": question}])
    except openai.APIError as exc:
        raise click.ClickException(f"the gateway: {exc}") from None
    extension = reply.gearshift
    out.print(f"answer [bold]{escape(reply.choices[0].message.content or '')}[/]  mode {extension['mode']}  "
              f"cost ${extension['cost_usd']['total']:.6f}  trajectory {extension['trajectory_id']}", highlight=False)
