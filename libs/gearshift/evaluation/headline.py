"""`gearshift eval headline`: the headline measurement in one command, against the stack the
settings point at (a running one, or one started in this process).

    1. forced instant / reasoning / agentic on the TRAIN split (train_n items per family): what
       the learned router learns from (run RUN_ID-train)
    2. forced modes and auto on the TEST split (n_per_family items per family): run RUN_ID
    3. the learned router trained on step 1's outcomes (evaluated offline on step 2's forced
       outcomes), registered as router-RUN_ID and published through the registry
    4. learned on the same test items, once the router service serves router-RUN_ID
    5. the headline report from run RUN_ID's stored trajectories

Every step resumes: the runs skip stored episodes, and a registered router-RUN_ID is not
trained again. Without `learned` among the modes, steps 1, 3 and 4 are skipped (evaluating a
candidate checkpoint in auto mode needs no router).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from rich.console import Console

from gearshift.api.common.v1.common_pb2 import RoutingStrategy
from gearshift.api.router.v1 import router_pb2, router_pb2_grpc
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.errors import DeadlineExceeded, NotFound, Unavailable
from gearshift.evaluation.harness import evaluate
from gearshift.evaluation.headline_report import HeadlineReport, build_headline, write_headline
from gearshift.evaluation.report import fetch_run
from gearshift.evaluation.runner import FORCED, MODES
from gearshift.evaluation.suites import SuiteItem, get_suite
from gearshift.job_table import BY_NAME
from gearshift.routing.registry import publish
from gearshift.settings import Settings

ROUTER_PROBE = "What is 2 + 2?"  # any query: the reply names the router version that decided


@dataclass(frozen=True)
class HeadlinePlan:
    """What one headline measurement runs."""

    run_id: str
    suite: str = "headline"
    n_per_family: int = 60
    train_n: int = 15
    modes: tuple[str, ...] = MODES
    concurrency: int = 4
    router_embedding: str = "static"
    bootstrap_samples: int = 2000
    router_wait_seconds: float = 60.0
    policy_weights: str = ""  # what the in-process server loaded; empty: whatever the running stack serves

    def __post_init__(self) -> None:
        if self.n_per_family < 1 or self.train_n < 1:
            raise ValueError("--n-per-family and --train-n must be positive")
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or not self.modes:
            raise ValueError(f"unknown mode(s) {unknown}; choose from {', '.join(MODES)}")

    @property
    def train_run_id(self) -> str:
        return f"{self.run_id}-train"

    @property
    def router_version(self) -> str:
        return f"router-{self.run_id}"

    @property
    def learned(self) -> bool:
        return "learned" in self.modes


@dataclass
class Headline:
    report: HeadlineReport
    files: list[Path]
    errors: list[str]


def router_config(settings: Settings, plan: HeadlinePlan, out_dir: Path):
    """The router job's config: train on the train run, evaluate offline on the test run's forced outcomes."""
    return BY_NAME["router"].config_class().model_validate({
        "store_addr": settings.store_addr, "task_source": get_suite(plan.suite).name, "run_ids": [plan.train_run_id, plan.run_id],
        "train_splits": ["train"], "eval_split": "test", "embedding": plan.router_embedding,
        "bootstrap_samples": min(plan.bootstrap_samples, 1000),
        "output": {"dir": str(out_dir / "router"), "checkpoint_id": plan.router_version, "progress": False},
    })


async def _registered(stub: store_pb2_grpc.TrajectoryStoreStub, checkpoint_id: str) -> bool:
    try:
        await stub.GetCheckpoint(store_pb2.GetCheckpointRequest(id=checkpoint_id))
        return True
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return False
        raise


async def ensure_router(settings: Settings, plan: HeadlinePlan, out_dir: Path, console: Console | None) -> dict:
    """Trains and registers router-RUN_ID unless the registry holds it, then publishes it;
    returns its version and offline figures for the report."""
    async with channel(settings.store_addr, settings) as ch:
        stub = store_pb2_grpc.TrajectoryStoreStub(ch)
        if not await _registered(stub, plan.router_version):
            config = router_config(settings, plan, out_dir)
            result = await asyncio.to_thread(BY_NAME["router"].train, config)
            if console and result.get("evaluation") is not None:
                console.print(result["evaluation"].table())
        checkpoint = await publish(stub, plan.router_version)
    return {"version": checkpoint.id, "uri": checkpoint.uri, "train_run": plan.train_run_id, "eval_metrics": dict(checkpoint.eval_metrics)}


async def wait_for_router(settings: Settings, version: str, timeout: float) -> None:
    """Returns once the router service decides with `version` (it polls the registry)."""
    deadline = time.monotonic() + timeout
    served = ""
    async with channel(settings.router_addr, settings) as ch:
        stub = router_pb2_grpc.RouterStub(ch)
        while time.monotonic() < deadline:
            try:
                reply = await stub.Route(router_pb2.RouteRequest(query=ROUTER_PROBE, strategy=RoutingStrategy.ROUTING_STRATEGY_LEARNED))
                served = reply.router_version
                if served == version:
                    return
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:  # none loaded yet: keep waiting
                    raise
            await asyncio.sleep(0.5)
    raise DeadlineExceeded(f"the router service at {settings.router_addr} serves {served or 'no learned router'}, not {version}, "
                       f"after {timeout:.0f} s: is its learned router enabled (GEARSHIFT_LEARNED_ROUTER__ENABLED)?")


BUILTIN_MODELS = ("smollm2", "default", "tiny")


async def resolve_model(settings: Settings, model: str) -> str:
    """What the built-in policy server should load for --model: a built-in name or a directory
    as they are, else a checkpoint id looked up in the registry (its uri)."""
    if model in BUILTIN_MODELS or Path(model).expanduser().is_dir():
        return model
    async with channel(settings.store_addr, settings) as ch:
        try:
            checkpoint = await store_pb2_grpc.TrajectoryStoreStub(ch).GetCheckpoint(store_pb2.GetCheckpointRequest(id=model))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise NotFound(f"--model {model!r} is neither {', '.join(BUILTIN_MODELS)}, a directory, nor a registered checkpoint") from None
            raise
    return checkpoint.uri


def budgets(settings: Settings, policy_weights: str = "") -> dict:
    """The episode budgets and decoding every mode ran under (the executor's settings here), and
    the weights behind the served name: every checkpoint is served as the same name."""
    e = settings.executor
    return {"max_tokens_per_turn": e.max_tokens_per_turn, "max_steps_instant_reasoning": e.max_steps_other,
            "max_steps_agentic": e.max_steps_agentic, "max_tokens": e.max_tokens, "max_wall_seconds": e.max_wall_seconds,
            "temperature": e.temperature, "top_p": e.top_p, "frequency_penalty": e.frequency_penalty, "policy_served_as": settings.policy_client.model,
            "policy_weights": policy_weights or "as the running stack serves them"}


async def run_headline(settings: Settings, plan: HeadlinePlan, out_dir: Path, console: Console | None = None,
                       executor=None) -> Headline:
    """Runs (or resumes) the measurement and writes its report into out_dir."""
    suite = get_suite(plan.suite)
    test_items: list[SuiteItem] = suite.items_per_family("test", plan.n_per_family)
    runs_dir = out_dir / "runs"
    errors: list[str] = []
    router: dict = {}

    async def run(run_id: str, modes: list[str], items: list[SuiteItem], split: str) -> None:
        if console:
            console.rule(f"{run_id}: {', '.join(modes)} on {len(items)} {split} items")
        done = await evaluate(settings, plan.suite, modes, None, split=split, run_id=run_id, concurrency=plan.concurrency,
                              out_dir=runs_dir / run_id, console=console, executor=executor, items=items)
        errors.extend(done.summary.errors)
        if done.summary.aborted:
            raise Unavailable(f"the stack became unavailable during {run_id}; run the same command again to resume")

    if plan.learned:
        await run(plan.train_run_id, list(FORCED), suite.items_per_family("train", plan.train_n), "train")
    first = [m for m in plan.modes if m != "learned"]
    if first:
        await run(plan.run_id, first, test_items, "test")
    if plan.learned:
        router = await ensure_router(settings, plan, out_dir, console)
        await wait_for_router(settings, plan.router_version, plan.router_wait_seconds)
        await run(plan.run_id, ["learned"], test_items, "test")
    async with channel(settings.store_addr, settings) as ch:
        stored = await fetch_run(store_pb2_grpc.TrajectoryStoreStub(ch), plan.run_id)
    planned = {item.id for item in test_items}  # a run resumed with a larger n holds more: report the plan's items
    trajectories = [t for t in stored if t.labels.get("item_id") in planned]
    report = build_headline(trajectories, plan.run_id, budgets(settings, plan.policy_weights), plan.bootstrap_samples)
    report.router = router if plan.learned else {}
    return Headline(report, write_headline(report, out_dir), errors)
