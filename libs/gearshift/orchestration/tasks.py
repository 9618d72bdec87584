"""The Celery tasks of the closed loop. Each one claims a dedupe key in the job journal before
any side effect (see journal.py), so delivering a task twice does its work once:

    score_new -> build_snapshot -> train -> promote (evaluate + gate + publish)

`start_round` chains them; `check_trigger` (Celery beat) starts a round once
orchestration.trigger_new_scored scored trajectories arrived since the last round.

A copy of a task whose key a live worker holds (Redis hands out a task again after the
visibility timeout, however long it runs) raises Busy and is retried after a pause: it starts
nothing and returns nothing to its chain, and it stays on the broker, so when the holder dies it
finds the lease stale and takes the work over (a training run: re-attaching to it). The holder
keeps its lease fresh while it works (Lease.kept).

A holder taken for dead while it lived (it stalled past its lease) finds the run no longer its own
at its next write or confirm() (LeaseLost): it stops there, before promoting or publishing, and
its copy of the task ends without a trace (Journaled). A task started orchestration.max_attempts
times is parked: the next delivery fails it with its last error, and Celery delivers it no more.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from functools import lru_cache

import redis
from celery import Task, chain
from celery.exceptions import Ignore

from gearshift.api.common.v1.common_pb2 import CheckpointStatus
from gearshift.orchestration import checkpoint_registry, run_metrics, task_bodies
from gearshift.orchestration.app import app
from gearshift.orchestration.evaluators import GateEvaluator
from gearshift.orchestration.journal import Claim, JobJournal, Lease, LeaseLost, this_worker
from gearshift.orchestration.promotion import Evaluator
from gearshift.orchestration.publishing import Fence
from gearshift.orchestration.runners import Runner, make_runner
from gearshift.orchestration.training_run import RunSpec
from gearshift.settings import OrchestrationSettings, Settings, get_settings
from gearshift.storage import create_store_engine, upgrade_to_head

log = logging.getLogger(__name__)

# Tests and embedders replace how checkpoints are evaluated (the harness by default).
evaluator_factory: Callable[[Settings], Evaluator] = GateEvaluator


@lru_cache(maxsize=1)
def journal() -> JobJournal:
    """The job journal on the store's database, migrated first as the store does at start-up, or
    only checked where a migration Job runs them: SchemaMismatch (one line naming both revisions)
    fails the task, and the next task checks again."""
    from gearshift.storage import check_schema

    settings = get_settings()
    engine = create_store_engine(settings.store_database_url(), pool_size=2)
    try:
        (upgrade_to_head if settings.store.migrate_on_start else check_schema)(engine)
    except Exception:
        engine.dispose()
        raise
    return JobJournal(engine, settings.orchestration.lease_seconds, settings.orchestration.max_attempts)


class TaskFailed(Exception):
    """A task's work failed; the message names the original error (also in job_runs.error)."""


class Busy(Exception):
    """Another live worker holds the key (its lease is fresh): this copy checks again later."""

    def __init__(self, key: str, owner: str):
        super().__init__(key, owner)  # args that rebuild it from the result backend's JSON
        self.key, self.owner = key, owner

    def __str__(self) -> str:
        return f"{self.key} is being run by {self.owner}"


def busy_retry_seconds(orchestration: OrchestrationSettings) -> float:
    """How long a Busy copy waits before it checks again: at most a lease, so a dead holder's
    work is taken over within two leases; under half the visibility timeout, because a worker
    holding a countdown message longer than that gets it handed to a second worker too."""
    return min(orchestration.lease_seconds, orchestration.visibility_timeout_seconds / 2)


class Journaled(Task):
    """A task whose work holds a journal lease. A copy that lost its lease (taken for dead while
    it stalled) ends without a trace: acknowledged, no result stored over the holder's, its chain
    not continued (Ignore). The new holder finishes the work, and its own message stays on the
    broker until it does, so nothing is lost if it dies too."""

    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except LeaseLost as lost:
            log.warning("%s stops: %s", self.name, lost)
            raise Ignore() from lost


# Every task that claims a journal key: a Busy copy is retried for as long as the holder lives.
JOURNALED = {"base": Journaled, "autoretry_for": (Busy,), "max_retries": None,
             "default_retry_delay": busy_retry_seconds(get_settings().orchestration)}


def once(key: str, kind: str, params: dict, work: Callable[[Lease], dict]) -> dict:
    """Runs work(lease) unless the journal says it is done (its stored result), being done by a
    live worker (Busy) or out of attempts (TaskFailed, with its last error); keeps the lease while
    it works; records its result or error. LeaseLost (this key's) passes through unrecorded:
    the run is another worker's now."""
    book = journal()
    claim, run = book.claim(key, kind, params)
    if claim is Claim.DONE:
        run_metrics.RUNS.labels(kind, "deduplicated").inc()
        return run.result | {"deduplicated": True}
    if claim is Claim.BUSY:
        raise Busy(key, run.owner)
    if claim is Claim.PARKED:
        run_metrics.RUNS.labels(kind, "parked").inc()
        raise TaskFailed(run.error)  # a failure is acknowledged: Celery stops delivering it
    lease, started = Lease(book, run), time.monotonic()
    try:
        with lease.kept(), run_metrics.RUNS_RUNNING.labels(kind).track_inprogress():
            result = work(lease)
        lease.succeed(result | {"key": key})
    except Exception as exc:
        lost = isinstance(exc, LeaseLost) and exc.key == key
        run_metrics.ended(kind, "lost" if lost else "failed", time.monotonic() - started)
        if lost:
            raise
        message = f"{type(exc).__name__}: {exc}"
        lease.fail(message)
        # gRPC and other errors do not survive the JSON result backend: send their text.
        raise TaskFailed(message) from None
    run_metrics.ended(kind, "succeeded", time.monotonic() - started)
    return result | {"key": key}


@app.task(name="gearshift.orchestration.tasks.score_new", **JOURNALED)
def score_new(limit: int = 500) -> dict:
    """Scores completed trajectories that have a reference and no reward yet."""
    settings = get_settings()
    pending = asyncio.run(task_bodies.unscored_with_reference(settings, limit))
    if not pending:
        return {"scored": 0}
    key = f"score:{task_bodies.digest(sorted(t.id for t in pending))}"
    return once(key, "score", {"count": len(pending)},
                lambda *_: {"scored": asyncio.run(task_bodies.score(settings, pending))})


@app.task(name="gearshift.orchestration.tasks.build_snapshot", **JOURNALED)
def build_snapshot(previous: dict | None = None, data: dict | None = None) -> dict:
    """Freezes the trajectories a data filter matches (default: scored, correct, completed)."""
    settings = get_settings()
    data = data or {"correctness": "correct"}
    result = asyncio.run(task_bodies.snapshot(settings, data))
    return once(f"snapshot:{result['snapshot']}", "snapshot", {"data": data}, lambda *_: result)


@app.task(name="gearshift.orchestration.tasks.train", **JOURNALED)
def train(previous: dict | None = None, job: str = "sft", config: dict | None = None, parent_id: str = "", key: str = "") -> dict:
    """Runs one training job to its end (local subprocess or Kubernetes Job)."""
    settings = get_settings()
    previous = previous or {}
    data = previous.get("data")
    found = checkpoint_registry.get_checkpoint(settings, parent_id) if parent_id else checkpoint_registry.published(settings)
    parent = asyncio.run(found)
    key = key or f"train:{job}:{task_bodies.digest(config or {}, previous.get('snapshot'), parent.id if parent else '')}"
    spec = task_bodies.run_spec(settings, job, config or {}, key, data, parent)
    runner = make_runner(settings)

    def work(lease: Lease) -> dict:
        result = run_training(lease, runner, spec, settings.orchestration.job_timeout_seconds)
        return result | {"snapshot": previous.get("snapshot", "")}

    return once(key, "train", {"job": job, "config": spec.config}, work)


def run_training(lease: Lease, runner: Runner, spec: RunSpec, timeout: float) -> dict:
    """One training run of a claimed key, to its end. The runner's start() decides between
    re-attaching (a redelivered task whose run is still going, or done) and a new attempt (a
    retried run whose attempt failed): so the journal's recorded external id is only a record,
    updated to the attempt being watched. A lost lease ends the watch at its next look (the
    heartbeat raises LeaseLost) and leaves the run to the new holder, which watches it on."""
    external_id = runner.start(spec)
    lease.heartbeat(external_id=external_id)
    result = task_bodies.train(runner, spec, external_id, lambda tail: lease.heartbeat(log=tail), timeout)
    lease.heartbeat(log=result.pop("log_tail"))
    return result


@app.task(name="gearshift.orchestration.tasks.promote", **JOURNALED)
def promote(previous: dict | None = None, checkpoint_id: str = "") -> dict:
    """The promotion gate on a candidate: evaluate, compare with the published checkpoint,
    then publish it or mark it rejected."""
    settings = get_settings()
    checkpoint_id = checkpoint_id or (previous or {}).get("checkpoint_id", "")

    def work(lease: Lease) -> dict:
        outcome = asyncio.run(task_bodies.gate(settings, checkpoint_id, evaluator_factory(settings)))
        decision = outcome.decision
        result = {
            "checkpoint_id": checkpoint_id,
            "promoted": decision.promote,
            "reasons": decision.reasons,
            "candidate": task_bodies.eval_summary(decision.candidate),
            "baseline": task_bodies.eval_summary(decision.baseline) if decision.baseline else None,
            "baseline_id": outcome.baseline.id if outcome.baseline else "",
        }
        # An evaluation takes minutes: a copy taken for dead meanwhile stops here, and the
        # holder alone rejects or publishes.
        lease.confirm()
        if not decision.promote:
            asyncio.run(checkpoint_registry.update_checkpoint(settings, checkpoint_id, CheckpointStatus.CHECKPOINT_STATUS_REJECTED, {}))
            return result
        try:
            return result | publish.run(checkpoint_id=checkpoint_id)
        except Busy as busy:  # an operator's publish of this checkpoint is under way: it finishes it
            return result | {"busy": True, "owner": busy.owner}
        except LeaseLost as lost:  # the publish was taken over by another of its copies: that one finishes it
            return result | {"busy": True, "owner": lost.holder}

    return once(f"promote:{checkpoint_id}", "promote", {"checkpoint_id": checkpoint_id}, work)


@app.task(name="gearshift.orchestration.tasks.publish", **JOURNALED)
def publish(checkpoint_id: str) -> dict:
    """Switches serving to the checkpoint and marks it PUBLISHED (the previous one stays
    PUBLISHED in history; the newest published is the one served)."""
    settings = get_settings()

    def work(lease: Lease) -> dict:
        return asyncio.run(task_bodies.publish(settings, checkpoint_id, Fence(lease.key, lease.run.attempts)))

    return once(f"publish:{checkpoint_id}", "publish", {"checkpoint_id": checkpoint_id}, work)


def round_chain(settings: Settings, job: str, config: dict, data: dict | None = None):
    """One training round as a Celery chain: score -> snapshot -> train -> promote. The parent
    is fixed now (the published checkpoint), so a redelivered train task has the same key."""
    parent = asyncio.run(checkpoint_registry.published(settings))
    parent_id = parent.id if parent else ""
    return chain(score_new.si(), build_snapshot.s(data=data), train.s(job=job, config=config, parent_id=parent_id), promote.s())


@app.task(name="gearshift.orchestration.tasks.start_round")
def start_round(job: str | None = None, config: dict | None = None, data: dict | None = None) -> dict:
    """Starts one training round now. Started twice, the second chain finds every step done."""
    settings = get_settings()
    job = job or settings.orchestration.round_job
    config = config if config is not None else settings.orchestration.round_config
    return {"chain": round_chain(settings, job, config, data).apply_async().id}


@lru_cache(maxsize=1)
def broker() -> redis.Redis:
    return redis.Redis.from_url(app.conf.broker_url)


def claim_interval(interval: float) -> tuple[bool, int]:
    """(whether this trigger is the first of its interval window, the window's number): a Redis
    key per window, set only if absent (SET NX) and expiring after two windows. Two beats (a
    rollout's old and new pod, a second `gearshift up`) then check the trigger once per interval."""
    window = int(time.time() // interval)
    first = broker().set(f"gearshift:trigger:{window}", this_worker(), nx=True, ex=max(1, math.ceil(2 * interval)))
    return bool(first), window


@app.task(name="gearshift.orchestration.tasks.check_trigger")
def check_trigger() -> dict:
    """Starts a round when enough new scored trajectories arrived since the last round (once
    per trigger interval, however many beats send it)."""
    settings = get_settings()
    first, window = claim_interval(settings.orchestration.trigger_interval_seconds)
    if not first:
        return {"window": window, "skipped": True}
    last = journal().latest("round")
    since = int(last.params.get("watermark_us", 0)) if last else 0
    needed = settings.orchestration.trigger_new_scored
    count, newest = asyncio.run(task_bodies.count_scored_since(settings, since, needed))
    if count < needed:
        return {"window": window, "new_scored": count, "needed": needed, "started": False}
    key = f"round:{newest}"
    claim, run = journal().claim(key, "round", {"watermark_us": newest, "job": settings.orchestration.round_job})
    if claim is not Claim.NEW:
        return {"window": window, "new_scored": count, "started": False, "key": key}
    chain_id = round_chain(settings, settings.orchestration.round_job, settings.orchestration.round_config).apply_async().id
    journal().succeed(key, run.owner, {"chain": chain_id, "watermark_us": newest})
    return {"window": window, "new_scored": count, "started": True, "key": key, "chain": chain_id}
