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
    from gearshift.stack import check_health, policy_health

    settings = get_settings()
    results = asyncio.run(check_health(settings, timeout))
    results["policy"] = (settings.policy_url, policy_health(settings.policy_url))
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


@main.command()
@click.argument("question")
@click.option("--mode", type=click.Choice(["auto", "instant", "reasoning", "agentic"]), default="auto", show_default=True)
@click.option("--reference", default="", help="Reference answer; the trajectory is then scored")
@click.option("--max-steps", type=int, default=0, help="Turn budget (0 = the mode's default)")
@click.option("--json", "as_json", is_flag=True, help="Print the stored trajectory as JSON instead of the live view")
def solve(question: str, mode: str, reference: str, max_steps: int, as_json: bool) -> None:
    """Answer a question through the executor, showing mode, plan, tool calls and answer live."""
    import grpc
    from rich.console import Console

    from gearshift import console as view
    from gearshift.executor.v1 import executor_pb2

    request = executor_pb2.SolveRequest(
        query=question, mode=view.MODE_BY_NAME[mode], reference_answer=reference, budget=executor_pb2.Budget(max_steps=max_steps)
    )
    out = Console()
    try:
        trajectory = asyncio.run(view.solve(get_settings(), request, None if as_json else view.LiveView(out)))
    except grpc.aio.AioRpcError as exc:
        raise click.ClickException(f"{exc.code().name}: {exc.details()}") from None
    if as_json:
        click.echo(view.as_json(trajectory))
    else:
        out.print(view.summary_table(trajectory))
        out.print(f"trajectory {trajectory.id}")


DEMO_QUESTIONS = (
    ("What is the capital of France?", "auto", "Paris"),
    ("What is 17*23?", "agentic", "391"),
    ("Tom has 3 boxes of 12 apples and eats 5. How many apples are left?", "reasoning", "31"),
)


@main.command()
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, help="Where the SQLite store lives")
@click.option("--base-port", type=int, default=None, help="First of seven consecutive ports")
def demo(data_dir: str | None, base_port: int | None) -> None:
    """Start the embedded stack, solve a few example questions live, then stop it."""
    from rich.console import Console

    from gearshift import console as view
    from gearshift.executor.v1 import executor_pb2
    from gearshift.stack import Stack

    out = Console()
    stack = Stack(get_settings(), data_dir=data_dir, base_port=base_port)
    stack.start()
    try:
        results = stack.wait_ready()
        down = [name for name, (_, state) in results.items() if state != "SERVING"]
        if down:
            raise click.ClickException(f"not ready: {', '.join(down)}")
        settings = stack.client_settings()
        for question, mode, reference in DEMO_QUESTIONS:
            out.rule(f"{question}  [dim](mode {mode}, reference {reference})[/]")
            request = executor_pb2.SolveRequest(query=question, mode=view.MODE_BY_NAME[mode], reference_answer=reference)
            trajectory = asyncio.run(view.solve(settings, request, view.LiveView(out)))
            out.print(view.summary_table(trajectory))
        out.print(f"stored in {stack.data_dir / 'store.db'}; read them with `gearshift trajectories list`")
    finally:
        stack.stop()


@main.command()
@click.argument("job", type=click.Choice(["sft", "distill", "apo"]))
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False), help="JSON or YAML job config")
def train(job: str, config_path: str) -> None:
    """Run a training job; writes a checkpoint directory with result.json."""
    from gearshift.training.cli import run_job, summary

    click.echo(summary(run_job(job, config_path)))


@main.command()
@click.option("--quick", is_flag=True, help="The test-sized round (a few items, a couple of steps) instead of the default")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None, help="JSON LoopConfig fields overriding the preset's")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Summary JSON (default: DATA_DIR/loop/ROUND_ID/summary.json)")
def loop(quick: bool, config_path: str | None, out: str | None) -> None:
    """One closed-loop round in this process: seed, score, SFT, APO, evaluate, gate, publish."""
    from gearshift.orchestration.loop import main as loop_main

    loop_main(get_settings(), quick, config_path, out)


@main.group()
def trajectories() -> None:
    """Read stored trajectories."""


@trajectories.command("list")
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--mode", type=click.Choice(["instant", "reasoning", "agentic"]), default=None)
@click.option("--source", default="", help="Only this task source")
def trajectories_list(limit: int, mode: str | None, source: str) -> None:
    """List the newest trajectories."""
    from rich.console import Console

    from gearshift import console as view
    from gearshift.store.v1 import store_pb2

    query = store_pb2.QueryRequest(
        filter=store_pb2.TrajectoryFilter(modes=[view.MODE_BY_NAME[mode]] if mode else [], task_source=source), page_size=limit
    )
    page = store_call(lambda stub: stub.Query(query))
    Console().print(view.trajectories_table(list(page.trajectories)))


@trajectories.command("show")
@click.argument("trajectory_id")
@click.option("--json", "as_json", is_flag=True, help="The whole trajectory as JSON")
def trajectories_show(trajectory_id: str, as_json: bool) -> None:
    """Show one trajectory: its transcript and its figures."""
    from rich.console import Console

    from gearshift import console as view
    from gearshift.protocol.a2fm import render_transcript
    from gearshift.store.v1 import store_pb2

    trajectory = store_call(lambda stub: stub.Get(store_pb2.GetRequest(id=trajectory_id))).trajectory
    if as_json:
        click.echo(view.as_json(trajectory))
        return
    out = Console()
    out.print(f"[bold]query[/] {trajectory.query}")
    out.print(render_transcript(trajectory), markup=False, highlight=False)
    out.print(view.summary_table(trajectory))


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
    from gearshift.evaluation.cli import run_eval

    run_eval(get_settings(), suite, modes, n, samples, split, run_id, concurrency, out_dir, inprocess)


@eval_.command("compare")
@click.argument("run_a")
@click.argument("run_b")
def eval_compare(run_a: str, run_b: str) -> None:
    """Show per-mode differences of run B against run A."""
    from gearshift.evaluation.cli import run_compare

    run_compare(get_settings(), run_a, run_b)


@eval_.command("report")
@click.argument("run_id")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, help="Report folder (default: DATA_DIR/eval/RUN_ID)")
def eval_report(run_id: str, out_dir: str | None) -> None:
    """Recompute and rewrite a stored run's report."""
    from gearshift.evaluation.cli import run_report

    run_report(get_settings(), run_id, out_dir)


def store_call(call):
    """Runs one store rpc; gRPC errors become a one-line CLI message."""
    import grpc

    from gearshift.clients import service_channel
    from gearshift.store.v1 import store_pb2_grpc

    async def run():
        async with service_channel("store") as channel:
            return await call(store_pb2_grpc.TrajectoryStoreStub(channel))

    try:
        return asyncio.run(run())
    except grpc.aio.AioRpcError as exc:
        raise click.ClickException(f"{exc.code().name}: {exc.details()}") from None


# `gearshift router train|publish|list`: the router training job's commands (lazy imports inside).
from gearshift.jobs.router.cli import router as _router_group  # noqa: E402

main.add_command(_router_group)


if __name__ == "__main__":
    main()
