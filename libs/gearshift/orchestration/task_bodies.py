"""The bodies of the Celery tasks (tasks.py), callable without Celery: score, snapshot, train,
evaluate, promote. The loop (loop.py) runs the same bodies in one process. The trajectory store
and the reward service are reached over gRPC like every other client; only the job journal is
read directly from the database.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from gearshift.api.common.v1.common_pb2 import Checkpoint, CheckpointStatus, Trajectory, TrajectoryStatus
from gearshift.api.reward.v1 import reward_pb2, reward_pb2_grpc
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.clients import channel
from gearshift.errors import FailedPrecondition, NotFound
from gearshift.evaluation.runner import SUITE_VERIFIER
from gearshift.evaluation.suites import suite_name
from gearshift.job_table import JOB_NAMES
from gearshift.orchestration import publishing
from gearshift.orchestration.checkpoint_registry import get_checkpoint, published, update_checkpoint
from gearshift.orchestration.promotion import Decision, EvalResult, Evaluator, Margins, decide, metrics
from gearshift.orchestration.runners import Heartbeat, Runner
from gearshift.orchestration.training_run import RunSpec
from gearshift.rewards.scoring import APO, score_group
from gearshift.routing.registry import ROUTER_KIND
from gearshift.settings import Settings
from gearshift.training.config import TRAINING_PURPOSES
from gearshift.training.data import PURPOSES

SCORED = -1e308  # min_reward at or above this matches every scored trajectory


def digest(*parts) -> str:
    """A short stable hash of JSON-able parts (dedupe keys, run names)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_name(job: str, key: str) -> str:
    """A DNS-1123 name for a run (Kubernetes Job and ConfigMap names)."""
    return re.sub(r"[^a-z0-9-]", "-", f"gearshift-{job}-{digest(key)}".lower())[:52]


def checkpoints_dir(settings: Settings) -> Path:
    return settings.orchestration.checkpoints_dir or settings.data_dir / "checkpoints"


# ---------------------------------------------------------------- scoring


async def unscored_with_reference(settings: Settings, limit: int) -> list:
    """Completed, unscored trajectories that carry a reference answer (oldest first)."""
    flt = store_pb2.TrajectoryFilter(
        correctness=store_pb2.CORRECTNESS_UNSCORED, statuses=[TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED]
    )
    found = []
    async with channel(settings.store_addr, settings) as ch:
        # With turns: the format check (and so the reward) reads them.
        async for trajectory in store_pb2_grpc.TrajectoryStoreStub(ch).Export(store_pb2.ExportRequest(filter=flt, include_turns=True)):
            if trajectory.reference_answer:
                found.append(trajectory)
                if len(found) >= limit:
                    break
    return found


async def score(settings: Settings, trajectories: list) -> int:
    """Scores trajectories with the APO reward (one group per query and reference, so the
    forced-instant success rate is the group's) and stores each reward.

    A group an evaluation suite already graded keeps the suite's verdicts (its own grader is
    the authority on its answers); the same reward formulas then run here on those verdicts.
    Other groups are verified and scored by the reward service."""
    groups = defaultdict(list)
    for trajectory in trajectories:
        groups[(trajectory.query, trajectory.reference_answer)].append(trajectory)
    scored = 0
    async with channel(settings.reward_addr, settings) as reward_ch, channel(settings.store_addr, settings) as store_ch:
        reward = reward_pb2_grpc.RewardStub(reward_ch)
        store = store_pb2_grpc.TrajectoryStoreStub(store_ch)
        for (_, reference), rollouts in groups.items():
            if all(r.reward.verifier.startswith(SUITE_VERIFIER) for r in rollouts):
                verdicts = [r.reward.correct for r in rollouts]
                group = score_group(rollouts, verdicts, APO, rollouts[0].reward.verifier, settings.reward)
                rewards = zip((r.id for r in rollouts), group.rewards)
            else:
                reply = await reward.Score(
                    reward_pb2.ScoreRequest(reference_answer=reference, kind=reward_pb2.REWARD_KIND_APO, rollouts=rollouts)
                )
                rewards = ((one.trajectory_id, one.reward) for one in reply.scored)
            for trajectory_id, one in rewards:
                await store.SetReward(store_pb2.SetRewardRequest(id=trajectory_id, reward=one))
                scored += 1
    return scored


async def count_scored_since(settings: Settings, since_us: int, enough: int) -> tuple[int, int]:
    """(how many scored trajectories were created after since_us, capped at `enough`; the
    newest one's creation time in microseconds, or since_us when there is none). Evaluation and
    gate runs do not count: they are not new training data."""
    flt = store_pb2.TrajectoryFilter(min_reward=SCORED, purposes=[PURPOSES[p] for p in TRAINING_PURPOSES])
    if since_us:
        flt.created_after.FromMicroseconds(since_us + 1)
    count, newest = 0, since_us
    async with channel(settings.store_addr, settings) as ch:
        request = store_pb2.ExportRequest(filter=flt, limit=enough)
        async for trajectory in store_pb2_grpc.TrajectoryStoreStub(ch).Export(request):
            count += 1
            newest = max(newest, trajectory.created_at.ToMicroseconds())
    return count, newest


# ---------------------------------------------------------------- dataset snapshots


async def matching(settings: Settings, data: dict, include_turns: bool = False) -> dict[str, Trajectory]:
    """The stored trajectories a job's `data` section (DataConfig) matches now, by id: one Export
    per filter (one per run id), in order, each trajectory once."""
    from gearshift.training.config import DataConfig
    from gearshift.training.data import trajectory_filters

    found: dict[str, Trajectory] = {}
    async with channel(settings.store_addr, settings) as ch:
        store = store_pb2_grpc.TrajectoryStoreStub(ch)
        for flt in trajectory_filters(DataConfig.model_validate(data)):
            found |= {t.id: t async for t in store.Export(store_pb2.ExportRequest(filter=flt, include_turns=include_turns))}
    return found


async def matching_ids(settings: Settings, data: dict) -> list[str]:
    """The ids of the stored trajectories a data filter matches now."""
    return list(await matching(settings, data))


async def count_matching(settings: Settings, data: dict) -> int:
    """How many stored trajectories a data filter matches now."""
    return len(await matching_ids(settings, data))


async def snapshot(settings: Settings, data: dict, content: bool = False) -> dict:
    """Freezes what a data filter matches now: the ids, named by their hash (the trainers'
    snapshot id), written to data_dir/snapshots/<id>.json. With `content`, also a hash of the
    text the episodes teach (it names the default policy's checkpoint: episode ids are
    deterministic, so a changed teacher keeps the ids, not the text)."""
    from gearshift.training.data import snapshot_id

    found = await matching(settings, data, include_turns=content)
    if not found:
        raise FailedPrecondition(f"no trajectories match {data}")
    name = snapshot_id(found)
    path = settings.data_dir / "snapshots" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"id": name, "data": data, "trajectory_ids": sorted(found)}))
    frozen = {"snapshot": name, "count": len(found), "path": str(path), "data": data}
    if content:
        taught = {id_: [(turn.output, [r.output for r in turn.tool_results]) for turn in t.turns] for id_, t in found.items()}
        frozen["content"] = digest(taught)
    return frozen


# ---------------------------------------------------------------- training


def run_spec(settings: Settings, job: str, base: dict, key: str, data: dict | None, parent: Checkpoint | None) -> RunSpec:
    """The run of a job, with its --config: the caller's base config, the data filter, the parent
    checkpoint as starting weights (lineage), a checkpoint id and directory derived from the dedupe
    key (a retried run writes the same checkpoint), and the store to read from and register in."""
    if job not in JOB_NAMES:
        raise FailedPrecondition(f"unknown training job {job!r}; one of {', '.join(JOB_NAMES)}")
    name = run_name(job, key)
    output_dir = checkpoints_dir(settings) / name
    config = json.loads(json.dumps(base))  # a deep copy
    if data is not None:
        config["data"] = config.get("data", {}) | data
    if parent is not None:
        config.setdefault("model", {}).update(base=parent.uri, parent_checkpoint_id=parent.id)
    config["output"] = config.get("output", {}) | {"dir": str(output_dir), "checkpoint_id": name}
    config.setdefault("store_addr", settings.store_addr)
    return RunSpec(name=name, job=job, config=config, output_dir=output_dir)


def train(runner: Runner, spec: RunSpec, external_id: str, heartbeat: Heartbeat, timeout: float) -> dict:
    """Starts (or re-attaches to) the run and waits for it; its result.json, or the registry's
    record of the checkpoint when the result file is on storage this worker cannot read."""
    outcome = runner.wait(spec, external_id, heartbeat, timeout)
    if not outcome.succeeded:
        raise FailedPrecondition(f"training run {spec.name} failed: {outcome.reason}\n{outcome.log[-2000:]}")
    result = outcome.result or {"checkpoint_id": spec.config["output"]["checkpoint_id"]}
    return {"checkpoint_id": result.get("checkpoint_id") or result.get("id") or spec.name, "run": spec.name,
            "output_dir": str(spec.output_dir), "metrics": result.get("metrics", {}), "log_tail": outcome.log[-4000:]}


# ---------------------------------------------------------------- promotion


@dataclass
class GateOutcome:
    decision: Decision
    candidate: Checkpoint
    baseline: Checkpoint | None


async def gate(settings: Settings, checkpoint_id: str, evaluator: Evaluator) -> GateOutcome:
    """Evaluates the candidate and the published checkpoint on the same items (the published
    one's evaluation resumes from the store: nothing is solved twice), records both's figures
    in the registry, and decides."""
    o = settings.orchestration
    candidate = await get_checkpoint(settings, checkpoint_id)
    if not candidate.id:
        raise NotFound(f"checkpoint {checkpoint_id} is not registered")
    suite = suite_name(o.eval_suite)  # figures are filed under the suite's name, even for a .jsonl path
    # Evaluators are synchronous (they may run an event loop of their own): off this loop.
    result = await asyncio.to_thread(evaluator.evaluate, candidate)
    await update_checkpoint(settings, candidate.id, 0, metrics(result, suite, o.eval_split))
    baseline = await published(settings, candidate.kind or "policy")
    baseline_result = None
    if baseline is not None and baseline.id != candidate.id:
        baseline_result = await asyncio.to_thread(evaluator.evaluate, baseline)
        await update_checkpoint(settings, baseline.id, 0, metrics(baseline_result, suite, o.eval_split))
    decision = decide(result, baseline_result, Margins(o.accuracy_margin, o.cost_of_pass_margin, o.gate_requires_improvement))
    return GateOutcome(decision, candidate, baseline if baseline_result else None)


async def publish(settings: Settings, checkpoint_id: str, fence: publishing.Fence | None = None) -> dict:
    """Switches serving to a checkpoint and marks it PUBLISHED (the newest published one is the
    one served): a policy through the configured publish target, a router by the mark alone
    (router services poll the registry)."""
    checkpoint = await get_checkpoint(settings, checkpoint_id)
    report = {}
    if checkpoint.kind != ROUTER_KIND:
        published_report = await asyncio.to_thread(publishing.publish, checkpoint, settings, fence)
        report = {"target": published_report.target, "switch_seconds": published_report.switch_seconds}
    await update_checkpoint(settings, checkpoint_id, CheckpointStatus.CHECKPOINT_STATUS_PUBLISHED, report)
    return {"published": checkpoint_id, "kind": checkpoint.kind} | report


def eval_summary(results: dict[str, EvalResult]) -> dict:
    """JSON-safe figures per gated mode (inf as null)."""
    return {mode: {"accuracy": r.accuracy, "cost_of_pass": r.cost_of_pass if math.isfinite(r.cost_of_pass) else None}
            for mode, r in results.items()}
