"""One full round of the closed loop on the embedded default, in this process (`gearshift loop`).

    seed -> score -> SFT -> APO -> evaluate -> gate -> publish
    feedback ------> SFT -> APO -> evaluate -> gate -> publish     (from_feedback: gateway traffic)

The six services and the built-in policy server run in this process (the store is the SQLite
file in the data directory, or GEARSHIFT_DATABASE_URL); the trainers run as local subprocesses
through the orchestration runner. Every stage is a function of gearshift.orchestration.task_bodies
or the evaluation harness, the code the Celery tasks run; only their order lives here. The
policy server is asked what it serves over its HTTP API, as any client asks it.

Ids are deterministic (the seed run, the training run names, the evaluation runs), so running
the same round again resumes: stored trajectories are not solved again and finished training
runs are not trained again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from pathlib import Path

from pydantic import BaseModel, Field, model_validator
from rich.console import Console
from rich.table import Table

from gearshift import weights
from gearshift.api.common.v1.common_pb2 import Checkpoint, CheckpointStatus, Purpose, Sampling, Trajectory, TrajectoryStatus
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.errors import FailedPrecondition
from gearshift.evaluation.harness import evaluate
from gearshift.evaluation.report import fetch_run
from gearshift.evaluation.runner import RETRIED, eval_mode_of
from gearshift.evaluation.suites import family_of_trajectory, get_suite, suite_name
from gearshift.orchestration import checkpoint_registry, task_bodies
from gearshift.orchestration.evaluators import GateEvaluator
from gearshift.orchestration.publishing import publish_builtin
from gearshift.orchestration.runners import LocalRunner
from gearshift.policy_client import PolicyClient
from gearshift.rewards.cost_of_pass import cost_of_pass
from gearshift.sampling import SEEDS
from gearshift.settings import Settings
from gearshift.training.results import read_metrics

HELD_OUT = "test"


class LoopConfig(BaseModel):
    """The size of one round. DEFAULT fits about 10-15 minutes on 2 CPU cores with
    SmolLM2-135M; QUICK is the same pipeline at a size a test runs in about a minute."""

    base_model: str = Field("smollm2", description='Weights of the first round ("smollm2", "tiny" or a checkpoint directory); later rounds start from the newest published checkpoint')
    suite: str = Field("facts", description="Evaluation suite (or .jsonl file) whose train split seeds and whose test split is held out (facts: the base model answers some, so SFT has correct seeds)")
    seed_items: int = Field(16, ge=1, description="Train items solved to seed the round")
    seed_modes: list[str] = Field(["instant", "reasoning"], description="Forced modes each seed item is solved in")
    seed_samples: int = Field(1, ge=1, description="Episodes per seed item and mode (rejection sampling: SFT keeps the correct ones)")
    seed_temperature: float = Field(0.0, ge=0, description="Sampling temperature of the seed episodes (0: greedy; use above 0 with seed_samples > 1)")
    eval_items: int = Field(10, ge=1, description="Held-out (test split) items each checkpoint is evaluated on")
    eval_modes: list[str] = Field(["instant", "reasoning"], description="Evaluation modes reported besides the gate's; forced-instant success gives APO's p")
    gate_modes: list[str] = Field(["auto"], description="Modes the promotion gate decides on (learned is added where a router is published)")
    gate_requires_improvement: bool = Field(False, description="The gate promotes an improvement only (accuracy interval above 0), not merely no loss")
    replay_suite: str = Field("", description="A suite whose train split the round also solves (greedy, in the seed modes) and learns from, so it keeps what the policy does there (e.g. headline)")
    replay_items: int = Field(0, ge=0, description="Train items of the replay suite (its families in turn)")
    guard_suite: str = Field("", description="A suite the gate also holds: base and candidate in auto on its test split; the candidate is rejected when one of its families falls by more than guard_max_drop, or its cost of pass rises by more than guard_max_cost_rise")
    guard_items: int = Field(0, ge=0, description="Test items of the guard suite (its families in turn)")
    guard_max_drop: float = Field(0.03, ge=0, le=1, description="The largest fall of a guard family's auto accuracy the gate accepts")
    guard_max_cost_rise: float = Field(0.25, ge=0, description="The largest relative rise of a guard family's auto cost of pass the "
                                       "gate accepts (0.25: a quarter dearer per correct answer); a family that had answers and has none "
                                       "is infinitely dearer")
    max_tokens_per_turn: int = Field(48, ge=8, description="Tokens per policy turn (serving, rollouts and evaluation alike)")
    max_steps: int = Field(1, ge=1, description="Policy turns per episode in every mode")
    sft_steps: int = Field(16, ge=0, description="SFT optimizer steps; 0 skips SFT, so APO starts from the base (one APO round on the model's own routing)")
    sft_batch_size: int = Field(4, ge=1, description="Trajectories per SFT step")
    sft_learning_rate: float = Field(2e-5, gt=0, description="SFT peak learning rate")
    apo_prompts: int = Field(2, ge=1, description="Train items APO rolls out on")
    apo_steps: int = Field(2, ge=1, description="APO optimizer steps (one prompt group each)")
    apo_rho: int = Field(1, ge=0, description="APO forced rollouts per mode per prompt")
    apo_gamma: int = Field(1, ge=0, description="APO free rollouts per prompt (the model routes itself)")
    apo_learning_rate: float = Field(1e-6, gt=0, description="APO learning rate")
    lora_rank: int = Field(
        0, ge=0, description="SFT and APO train a LoRA adapter of this rank (alpha twice the rank, every projection, as the default policy) instead of the full weights; 0: full weights"
    )
    seed: int = Field(0, ge=0, lt=SEEDS, description="Seed of the round's sampling (seed episodes, APO rollouts: each its own, derived from it) and of the trainers' shuffling and initialisation")
    threads: int = Field(2, ge=1, description="torch threads of the trainers and the policy server")
    concurrency: int = Field(4, ge=1, description="Episodes in flight at once in every stage that solves (seed, APO rollouts, evaluation, gate), so the policy server batches their turns")
    from_feedback: bool = Field(
        False, description="Learn from gateway traffic instead of seeding from the suite: SFT on the served trajectories clients judged correct (POST /v1/feedback), APO on up to apo_prompts of their queries in their conversations, the approved answers as references; evaluation and the gate stay on the suite's held-out split"
    )

    @model_validator(mode="after")
    def _named_suites_have_items(self) -> LoopConfig:
        for what in ("replay", "guard"):
            if getattr(self, f"{what}_suite") and not getattr(self, f"{what}_items"):
                raise ValueError(f"{what}_suite needs {what}_items of at least 1")
        return self


DEFAULT_CONFIG = LoopConfig()
QUICK_CONFIG = LoopConfig(
    seed_items=3, seed_modes=["instant"], eval_items=2, eval_modes=["instant"], max_tokens_per_turn=16,
    sft_steps=2, sft_batch_size=2, apo_prompts=1, apo_steps=1, apo_rho=1, apo_gamma=0,
)


def loop_settings(settings: Settings, config: LoopConfig) -> Settings:
    """Settings for the round's in-process stack: the round's episode budget everywhere,
    metrics off (free ports only), the gate on the held-out split of the round's suite."""
    executor = settings.executor.model_copy(update={
        "max_tokens_per_turn": config.max_tokens_per_turn, "max_steps_other": config.max_steps, "max_steps_agentic": config.max_steps,
    })
    orchestration = settings.orchestration.model_copy(update={
        "eval_suite": config.suite, "eval_split": HELD_OUT, "eval_items": config.eval_items, "gate_modes": config.gate_modes,
        "eval_concurrency": config.concurrency, "gate_requires_improvement": config.gate_requires_improvement,
    })
    planner = settings.planner.model_copy(update={"max_tokens": max(16, config.max_tokens_per_turn)})
    policy = settings.policy_server.model_copy(update={"port": 0, "threads": config.threads})
    return settings.model_copy(update={"executor": executor, "planner": planner, "orchestration": orchestration,
                                       "policy_server": policy, "metrics_port": 0})


# ---------------------------------------------------------------- the round


class Reporter:
    """Prints each stage with its figures and keeps them for the JSON summary."""

    def __init__(self, console: Console | None):
        self.console = console or Console(quiet=True)
        self.stages: dict[str, dict] = {}

    @contextlib.contextmanager
    def stage(self, name: str, what: str):
        self.console.rule(f"[bold]{name}[/] · {what}")
        figures: dict = {}
        started = time.perf_counter()
        yield figures
        figures["seconds"] = round(time.perf_counter() - started, 2)
        self.stages[name] = figures
        self.console.print("  " + "  ".join(f"{key} [bold]{_fmt(value)}[/]" for key, value in figures.items() if not isinstance(value, dict | list)))


def _fmt(value) -> str:
    if value is None:
        return "inf"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


async def base_checkpoint(settings: Settings, config: LoopConfig) -> Checkpoint:
    """The round's starting point: the newest published policy, else the configured base model
    registered (and published: it is what serves) under an id derived from its path."""
    current = await checkpoint_registry.published(settings)
    if current is not None:
        return current
    uri = str(weights.resolve(config.base_model, settings.models_dir).resolve())
    checkpoint = Checkpoint(id=f"base-{task_bodies.digest(uri)}", kind="policy", uri=uri, job="base",
                            status=CheckpointStatus.CHECKPOINT_STATUS_PUBLISHED)
    async with channel(settings.store_addr, settings) as ch:
        return await store_pb2_grpc.TrajectoryStoreStub(ch).RegisterCheckpoint(store_pb2.RegisterCheckpointRequest(checkpoint=checkpoint))


def model_config(config: LoopConfig) -> dict:
    """The trainers' model section: LoRA or full weights (the base comes from the parent checkpoint)."""
    return {"lora": True, "lora_rank": config.lora_rank, "lora_alpha": 2 * config.lora_rank} if config.lora_rank else {}


def sft_config(config: LoopConfig) -> dict:
    return {"batch_size": config.sft_batch_size, "max_length": 1024, "model": model_config(config),
            "optim": {"max_steps": config.sft_steps, "learning_rate": config.sft_learning_rate, "seed": config.seed, "threads": config.threads},
            "output": {"progress": False}}


def apo_config(config: LoopConfig, prompts: list[dict]) -> dict:
    return {"prompts": prompts, "rho": config.apo_rho, "gamma": config.apo_gamma, "max_length": 1024, "task_source": "loop-apo",
            "model": model_config(config),
            "optim": {"max_steps": config.apo_steps, "learning_rate": config.apo_learning_rate, "seed": config.seed, "threads": config.threads},
            "rollout": {"max_tokens_per_turn": config.max_tokens_per_turn, "max_steps": config.max_steps, "concurrency": config.concurrency},
            "output": {"progress": False}}


# What a round from gateway traffic learns from: the served trajectories a client judged correct.
FEEDBACK_DATA = {"feedback_only": True, "correctness": "correct"}


def feedback_data(config: LoopConfig) -> tuple[dict, dict]:
    """SFT's and APO's data sections for a round from gateway traffic (DataConfig fields):
    rejection sampling on the clients' verdicts, every approved trajectory for SFT, up to
    apo_prompts of them for APO's prompts (the APO job keeps their conversations and takes the
    approved answer as the reference)."""
    return dict(FEEDBACK_DATA), FEEDBACK_DATA | {"limit": config.apo_prompts}


def round_name(config: LoopConfig, base: Checkpoint, feedback_snapshot: str = "") -> str:
    """The round's id, from what it computes: concurrency changes how fast a round runs, not
    what, and a round from feedback is named by the feedback it learns from too, so new verdicts
    make a new round instead of resuming the last one."""
    parts = [config.model_dump(exclude={"concurrency", "from_feedback"}), base.id]
    return f"round-{task_bodies.digest(*parts, *(['feedback', feedback_snapshot] if config.from_feedback else []))}"


async def train_job(settings: Settings, runner: LocalRunner, job: str, config: dict, key: str, data: dict | None, parent: Checkpoint) -> dict:
    """One training run through the orchestration runner (a subprocess), off this event loop:
    it serves the store the trainer reads from and registers in."""
    spec = task_bodies.run_spec(settings, job, config, key, data, parent)
    external_id = runner.start(spec)
    return await asyncio.to_thread(task_bodies.train, runner, spec, external_id, lambda _tail: None, settings.orchestration.job_timeout_seconds)


async def run_round(settings: Settings, config: LoopConfig, console: Console | None = None, out: Path | None = None) -> dict:
    """Runs one round; returns (and writes) its JSON summary."""
    settings = loop_settings(settings, config)
    report = Reporter(console)
    suite = get_suite(config.suite)
    # The store alone first, to find the round's base; then everything, serving that base.
    async with embedded(settings, ("store",)) as probe:
        base = await base_checkpoint(probe.settings, config)
    runner = LocalRunner(settings.data_dir / "runs", env={"GEARSHIFT_DATA_DIR": str(settings.data_dir)})
    async with embedded(settings, policy_model=base.uri) as platform:
        stack = platform.settings
        evaluator = GateEvaluator(stack, config.eval_modes)
        if config.from_feedback:  # SFT and APO read the verdicts through their data sections
            data, apo_data = await feedback_stage(stack, config, report)
            prompts, round_id = [], round_name(config, base, report.stages["feedback"]["snapshot"])
        else:  # SFT reads the seed run, APO gets the suite's items inline
            data, apo_data = await seed_stages(stack, config, suite, base, report), None
            prompts, round_id = suite_prompts(config, suite), round_name(config, base)

        parent = base
        what = "the served trajectories clients judged correct" if config.from_feedback else "the correct seed trajectories"
        with report.stage("sft", f"route-then-align on {what}, from {base.id}"
                          if config.sft_steps else "skipped: sft_steps is 0, APO starts from the base") as fig:
            if config.sft_steps:
                correct = await task_bodies.snapshot(stack, data)
                sft = await train_job(stack, runner, "sft", sft_config(config), f"{round_id}:sft", data, base)
                parent = await checkpoint_registry.get_checkpoint(stack, sft["checkpoint_id"])
                # SFT learns from the well-formed ones among the correct: its checkpoint's snapshot
                # names those, the frozen `correct` ones are what it was offered.
                fig |= {"correct": correct["count"], "correct_snapshot": correct["snapshot"],
                        "snapshot": parent.dataset_snapshot, "trajectories": sft["metrics"].get("trajectories"),
                        "checkpoint": sft["checkpoint_id"], **{k: sft["metrics"].get(k) for k in ("steps", "first_loss", "final_loss")}}

        where = "up to {} of their queries, in their conversations" if config.from_feedback else "{} train prompts"
        with report.stage("apo", f"GRPO with adaptive sampling on {where.format(config.apo_prompts)}, from {parent.id}") as fig:
            apo = await train_job(stack, runner, "apo", apo_config(config, prompts), f"{round_id}:apo", apo_data, parent)
            candidate = await checkpoint_registry.get_checkpoint(stack, apo["checkpoint_id"])
            history = read_metrics(Path(apo["output_dir"]))
            fig |= {"checkpoint": candidate.id, "parent": candidate.parent_id, "steps": apo["metrics"].get("steps"),
                    "prompts": apo["metrics"].get("prompts"), "rollouts": sum(h.get("rollouts", 0) for h in history),
                    "rollout_reward_mean": sum(h.get("reward_mean", 0.0) for h in history) / max(1, len(history))}

        await judge_stages(stack, config, suite, base, candidate, evaluator, report)

    summary = {"round_id": round_id, "config": config.model_dump(), "base": base.id, "candidate": candidate.id,
               "promoted": report.stages["gate"]["promoted"], "stages": report.stages,
               "before_after": before_after(report.stages["evaluate"]["base"], report.stages["evaluate"]["candidate"])}
    report.console.print(before_after_table(summary["before_after"], base.id, candidate.id))
    path = out or settings.data_dir / "loop" / round_id / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2))
    report.console.print(f"summary: {path}")
    return summary | {"summary_path": str(path)}


async def feedback_stage(stack: Settings, config: LoopConfig, report: Reporter) -> tuple[dict, dict]:
    """The round's data from gateway traffic: what clients judged, frozen (the snapshot names the
    round). Returns SFT's and APO's data sections."""
    data, apo_data = feedback_data(config)
    with report.stage("feedback", "served trajectories with a client's verdict (the gateway's POST /v1/feedback)") as fig:
        judged = await task_bodies.count_matching(stack, {"feedback_only": True, "completed_only": False})
        try:
            snapshot = await task_bodies.snapshot(stack, data)
        except FailedPrecondition:
            raise FailedPrecondition(
                f"no completed served trajectory has been judged correct by a client yet ({judged} with a verdict):"
                " send verdicts with POST /v1/feedback on the gateway (docs/gateway.md), then run the round again") from None
        fig |= {"snapshot": snapshot["snapshot"], "correct": snapshot["count"], "judged": judged}
    return data, apo_data


async def seed_stages(stack: Settings, config: LoopConfig, suite, base: Checkpoint, report: Reporter) -> dict:
    """Seed and score: the suite's train items solved in the forced seed modes (and the replay
    suite's, greedy), scored with the APO reward. Returns SFT's data section (the correct ones)."""
    with report.stage("seed", f"{suite.name} train split, {config.seed_items} items x {', '.join(config.seed_modes)} (forced)") as fig:
        seed_run = f"loop-seed-{task_bodies.digest(suite.name, config.seed_items, config.seed_modes, config.seed_samples, config.seed_temperature, config.seed, config.max_tokens_per_turn, config.max_steps, base.id)}"
        sampling = Sampling(temperature=config.seed_temperature, top_p=1.0, seed=config.seed) if config.seed_temperature else None
        seeded = await solve_train(stack, config, config.suite, config.seed_items, seed_run, config.seed_samples, sampling)
        fig |= {"run_id": seed_run, "episodes": seeded.summary.planned, "solved_now": seeded.summary.solved,
                "reused": seeded.summary.skipped, "correct": correct_of(seeded)}
        run_ids = [seed_run]
        if config.replay_suite:
            replay_run = f"loop-replay-{task_bodies.digest(config.replay_suite, config.replay_items, config.seed_modes, config.max_tokens_per_turn, config.max_steps, base.id)}"
            replayed = await solve_train(stack, config, config.replay_suite, config.replay_items, replay_run)
            fig |= {"replay_run_id": replay_run, "replay_episodes": replayed.summary.planned, "replay_correct": correct_of(replayed)}
            run_ids.append(replay_run)

    with report.stage("score", "APO reward from the reward service, one group per query") as fig:
        trajectories = await fetch_runs(stack, run_ids)
        completed = [t for t in trajectories if t.status == TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED]
        fig["scored"] = await task_bodies.score(stack, completed)
        rescored = await fetch_runs(stack, run_ids)
        fig["correct"] = sum(t.reward.correct for t in rescored)
        fig["mean_apo_reward"] = sum(t.reward.value for t in rescored) / max(1, len(rescored))
    # With a replay suite the runs alone say which trajectories are the round's.
    return {"correctness": "correct", "task_source": "" if config.replay_suite else suite.name, "split": "train", "run_ids": run_ids}


async def solve_train(stack: Settings, config: LoopConfig, suite: str, items: int, run_id: str, samples: int = 1, sampling: Sampling | None = None):
    """A suite's first train items solved in the forced seed modes, stored as training data."""
    return await evaluate(stack, suite, config.seed_modes, items, samples=samples, split="train", run_id=run_id,
                          concurrency=config.concurrency, out_dir=stack.data_dir / "eval" / run_id,
                          purpose=Purpose.PURPOSE_TRAINING, sampling=sampling)


def correct_of(evaluation) -> int:
    return sum(r.correct for r in evaluation.report.modes.values())


async def fetch_runs(stack: Settings, run_ids: list[str]) -> list:
    async with channel(stack.store_addr, stack) as ch:
        store = store_pb2_grpc.TrajectoryStoreStub(ch)
        return [t for run_id in run_ids for t in await fetch_run(store, run_id)]


def suite_prompts(config: LoopConfig, suite) -> list[dict]:
    """APO's inline prompts: the suite's first apo_prompts train items, graded by the suite."""
    return [{"query": item.question, "reference_answer": item.answer, "suite": config.suite,
             "labels": {k: v for k, v in item.labels(0).items() if k != "sample"}}
            for item in suite.items("train", config.apo_prompts)]


async def judge_stages(stack: Settings, config: LoopConfig, suite, base: Checkpoint, candidate: Checkpoint,
                       evaluator: GateEvaluator, report: Reporter) -> None:
    """Evaluate, guard, gate, publish: base and candidate on the suite's held-out split (and the
    guard suite's), the promotion gate, and the switch to the candidate (or its rejection)."""
    with report.stage("evaluate", f"{suite.name} held-out split, {config.eval_items} items x {', '.join(config.eval_modes)}") as fig:
        fig["base"] = await evaluator.run(base)
        fig["candidate"] = await evaluator.run(candidate)
        gate_mode = config.gate_modes[0]
        fig |= {f"{who}_{name}": fig[who][gate_mode][name] for who in ("base", "candidate") for name in ("accuracy", "apo_reward", "cost_of_pass_usd")}

    held, guard_reasons = await guard_stage(stack, config, base, candidate, report) if config.guard_suite else (True, [])

    with report.stage("gate", f"accuracy and cost of pass ({', '.join(config.gate_modes)}) vs the published {base.id}: 95% intervals") as fig:
        outcome = await task_bodies.gate(stack, candidate.id, evaluator)
        promote = outcome.decision.promote and held
        fig |= {"promoted": promote, "reasons": outcome.decision.reasons + guard_reasons,
                "baseline": outcome.baseline.id if outcome.baseline else ""}
        report.console.print("  " + "; ".join(fig["reasons"]))

    with report.stage("publish", "the built-in policy server switches to the candidate" if promote else "skipped: rejected") as fig:
        if promote:
            published = await publish_builtin(candidate, stack)
            await checkpoint_registry.update_checkpoint(stack, candidate.id, CheckpointStatus.CHECKPOINT_STATUS_PUBLISHED,
                                          {"switch_seconds": published.switch_seconds})
            fig |= {"switch_seconds": round(published.switch_seconds, 3), "serving": await served_weights(stack)}
        else:
            await checkpoint_registry.update_checkpoint(stack, candidate.id, CheckpointStatus.CHECKPOINT_STATUS_REJECTED, {})
            fig["serving"] = await served_weights(stack)


async def served_weights(settings: Settings) -> str:
    """The weights the policy server serves now, as its /v1/models says (the card's root)."""
    async with PolicyClient.from_settings(settings) as policy:
        cards = await policy.model_cards()
    return next((card.get("root", "") for card in cards if card["id"] == settings.policy_client.model), "")


async def guard_stage(stack: Settings, config: LoopConfig, base: Checkpoint, candidate: Checkpoint, report: Reporter) -> tuple[bool, list[str]]:
    """What the round must not trade away: base and candidate in auto on the guard suite's
    held-out split, family by family, in accuracy and in cost of pass (a family kept accurate
    by routing it to a dearer mode is no free gain). Returns whether every family held, and why not."""
    orchestration = stack.orchestration.model_copy(update={
        "eval_suite": config.guard_suite, "eval_split": HELD_OUT, "eval_items": config.guard_items, "gate_modes": ["auto"]})
    evaluator = GateEvaluator(stack.model_copy(update={"orchestration": orchestration}))
    with report.stage("guard", f"{suite_name(config.guard_suite)} held-out split, {config.guard_items} items x auto, by family") as fig:
        for who, checkpoint in (("base", base), ("candidate", candidate)):
            fig[f"{who}_run_id"] = (await evaluator.run(checkpoint))["run_id"]
            families = by_family(evaluator.trajectories[checkpoint.id], "auto")
            fig[who] = {family: accuracy(ts) for family, ts in families.items()}
            fig[f"{who}_cost_of_pass_usd"] = {family: family_cost_of_pass(ts) for family, ts in families.items()}
        accurate, fallen = guard_verdict(fig["base"], fig["candidate"], config.guard_max_drop)
        cheap, dearer = cost_guard_verdict(fig["base_cost_of_pass_usd"], fig["candidate_cost_of_pass_usd"], config.guard_max_cost_rise)
        fig["held"], fig["reasons"] = accurate and cheap, fallen + dearer
    return fig["held"], fig["reasons"]


def by_family(trajectories: list[Trajectory], mode: str) -> dict[str, list[Trajectory]]:
    """One evaluation mode's final trajectories (no retried attempt), per family."""
    out: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        if eval_mode_of(t) == mode and t.status not in RETRIED:
            out.setdefault(family_of_trajectory(t), []).append(t)
    return dict(sorted(out.items()))


def accuracy(trajectories: list[Trajectory]) -> float:
    return sum(t.reward.correct for t in trajectories) / len(trajectories)


def family_cost_of_pass(trajectories: list[Trajectory]) -> float:
    """Total cost (as billed) / correct answers; inf with none correct."""
    return cost_of_pass(sum(t.cost.total_usd for t in trajectories), sum(t.reward.correct for t in trajectories))


def guard_verdict(before: dict[str, float], after: dict[str, float], max_drop: float) -> tuple[bool, list[str]]:
    """Whether no family fell by more than max_drop (a family missing after counts as 0)."""
    fallen = [f"guard: {family} fell {before[family]:.1%} -> {after.get(family, 0.0):.1%}" for family in before
              if before[family] - after.get(family, 0.0) > max_drop + 1e-9]
    return not fallen, fallen or [f"guard: no family fell by more than {max_drop:.0%}"]


def cost_guard_verdict(before: dict[str, float], after: dict[str, float], max_rise: float) -> tuple[bool, list[str]]:
    """Whether no family's cost of pass rose by more than max_rise (relative). A family with no
    answer before has no cost of pass to keep; one missing after counts as answering nothing."""
    risen = [f"guard: {family} cost of pass ${before[family]:.6f} -> ${after.get(family, math.inf):.6f}" for family in before
             if math.isfinite(before[family]) and after.get(family, math.inf) > before[family] * (1 + max_rise) * (1 + 1e-9)]
    return not risen, risen or [f"guard: no family's cost of pass rose by more than {max_rise:.0%}"]


FIGURES = ("accuracy", "apo_reward", "cost_of_pass_usd", "mean_cost_usd", "mean_output_tokens", "format_valid")


def before_after(base: dict, candidate: dict) -> dict[str, dict[str, dict]]:
    """mode -> figure -> {before, after} for every evaluated mode."""
    return {mode: {name: {"before": base[mode][name], "after": candidate[mode][name]} for name in FIGURES}
            for mode in base if isinstance(base[mode], dict) and mode in candidate}


def before_after_table(rows: dict[str, dict[str, dict]], base_id: str, candidate_id: str) -> Table:
    table = Table(title=f"held-out split: {base_id} (before) -> {candidate_id} (after)", header_style="bold")
    for column in ("mode", "figure", "before", "after"):
        table.add_column(column)
    for mode, figures in rows.items():
        for name, pair in figures.items():
            table.add_row(mode, name, _fmt(pair["before"]), _fmt(pair["after"]))
    return table


def round_config(quick: bool, config_path: str | None, flags: dict | None = None) -> LoopConfig:
    """A round's config: the preset (QUICK or DEFAULT) with a JSON file's fields over it, and the
    command line's flags (--from-feedback) over both."""
    preset = QUICK_CONFIG if quick else DEFAULT_CONFIG
    overrides = json.loads(Path(config_path).read_text()) if config_path else {}
    return LoopConfig.model_validate(preset.model_dump() | overrides | (flags or {}))
