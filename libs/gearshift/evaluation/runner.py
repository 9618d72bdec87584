"""Runs a suite through the executor: one Solve per item x mode x sample, graded by the suite.

Every trajectory is tagged per the evaluation contract (task_source = suite, split, run_id,
labels item_id / difficulty / domain / sample, plus eval_mode) and has the deterministic id
uuid5(NAMESPACE_URL, "{run_id}/{item_id}/{mode}/{sample}"), so a resumed run skips what the
store already holds. An interrupted episode is stored CANCELLED by the executor, and one cut by
an infrastructure error (policy server down, no learned router published) FAILED; a resume runs
those again under the next attempt id ("{...}/{sample}/attempt{n}") and reports count only the
latest attempt. The suite's verdict replaces the executor's reward through SetReward (kind
"correctness", verifier "suite:<name>").
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

import grpc
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from gearshift.api.common.v1.common_pb2 import Purpose, Reward, RoutingStrategy, Sampling, Trajectory, TrajectoryStatus
from gearshift.api.executor.v1 import executor_pb2
from gearshift.api.store.v1 import store_pb2
from gearshift.evaluation.suites import Suite, SuiteItem
from gearshift.protocol.modes import MODE_OF, mode_name
from gearshift.sampling import derived_seed, with_seed

FORCED = MODE_OF  # the forced evaluation modes: name -> Mode
ROUTED = {"auto": RoutingStrategy.ROUTING_STRATEGY_MODEL, "learned": RoutingStrategy.ROUTING_STRATEGY_LEARNED}
MODES = (*FORCED, *ROUTED)
EVAL_MODE_LABEL = "eval_mode"
CORRECTNESS = "correctness"
# Endings a resume runs again: they say nothing about the model.
RETRIED = (TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED, TrajectoryStatus.TRAJECTORY_STATUS_FAILED)


SUITE_VERIFIER = "suite:"  # a stored reward whose verifier starts so carries a suite's verdict


def verifier_name(suite_name: str) -> str:
    """How a suite's verdict is marked in the stored reward."""
    return f"{SUITE_VERIFIER}{suite_name}"


def trajectory_id(run_id: str, item_id: str, mode: str, sample: int, attempt: int = 0) -> str:
    """The contract's deterministic id; later attempts (after a cancelled one) get a suffix."""
    key = f"{run_id}/{item_id}/{mode}/{sample}" + (f"/attempt{attempt}" if attempt else "")
    return str(uuid.uuid5(uuid.NAMESPACE_URL, key))


def parse_modes(text: str) -> list[str]:
    """"instant,auto" -> ["instant", "auto"], refusing unknown names."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"unknown mode(s) {unknown}; choose from {', '.join(MODES)}")
    return list(dict.fromkeys(modes))


@dataclass(frozen=True)
class Job:
    """One episode to run: an item in a mode, the k-th sample."""

    item: SuiteItem
    mode: str
    sample: int


@dataclass
class RunSummary:
    """What a run did: how many episodes were solved now, found stored, or failed."""

    run_id: str
    planned: int = 0
    skipped: int = 0
    solved: int = 0
    correct: int = 0
    errors: list[str] = field(default_factory=list)
    # Set when the stack became unreachable: the remaining jobs were not started.
    aborted: bool = False


class EvalRunner:
    """Runs jobs against an executor stub and a store stub (any objects with their methods)."""

    def __init__(self, executor, store, suite: Suite, run_id: str, concurrency: int = 4,
                 budget: executor_pb2.Budget | None = None, console: Console | None = None,
                 purpose: int = Purpose.PURPOSE_EVALUATION, sampling: Sampling | None = None):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.executor, self.store, self.suite, self.run_id = executor, store, suite, run_id
        self.concurrency, self.budget, self.console = concurrency, budget, console
        self.purpose, self.sampling = purpose, sampling
        self._unavailable = asyncio.Event()

    def jobs(self, items: Iterable[SuiteItem], modes: Iterable[str], samples: int) -> list[Job]:
        return [Job(item, mode, sample) for item in items for mode in modes for sample in range(samples)]

    def request(self, job: Job, attempt: int) -> executor_pb2.SolveRequest:
        """The tagged SolveRequest of a job."""
        item = job.item
        request = executor_pb2.SolveRequest(
            query=item.question,
            reference_answer=item.answer,
            trajectory_id=trajectory_id(self.run_id, item.id, job.mode, job.sample, attempt),
            task_source=self.suite.name,
            split=item.split,
            run_id=self.run_id,
            labels=item.labels(job.sample) | {EVAL_MODE_LABEL: job.mode},
            purpose=self.purpose,
            sampling=self.episode_sampling(job),
        )
        if job.mode in FORCED:
            request.mode = FORCED[job.mode]
        else:
            request.strategy = ROUTED[job.mode]
        if self.budget is not None:
            request.budget.CopyFrom(self.budget)
        return request

    def episode_sampling(self, job: Job) -> Sampling | None:
        """The run's sampling for one episode; a seeded run gives each item x mode x sample its own
        seed (the same for every checkpoint, so two checkpoints' samples are paired)."""
        if self.sampling is None or not self.sampling.HasField("seed"):
            return self.sampling
        seed = derived_seed(self.sampling.seed, job.item.id, job.mode, job.sample)
        return with_seed(self.sampling, seed)

    async def stored(self) -> dict[str, Trajectory]:
        """This run's trajectories already in the store, by id."""
        request = store_pb2.ExportRequest(filter=store_pb2.TrajectoryFilter(run_id=self.run_id))
        return {t.id: t async for t in self.store.Export(request)}

    async def run(self, items: Iterable[SuiteItem], modes: Iterable[str], samples: int = 1) -> RunSummary:
        jobs = self.jobs(items, modes, samples)
        summary = RunSummary(self.run_id, planned=len(jobs))
        stored = await self.stored()
        pending: list[tuple[Job, int]] = []
        for job in jobs:
            attempt, done = self._resume_point(job, stored)
            if done is None:
                pending.append((job, attempt))
                continue
            summary.skipped += 1
            if done.reward.verifier != verifier_name(self.suite.name):  # stored, but stopped before grading
                await self._grade(job, done)
        semaphore = asyncio.Semaphore(self.concurrency)
        with self._progress() as progress:
            task = progress.add_task(f"{self.suite.name} · {self.run_id}", total=len(jobs), completed=summary.skipped)

            async def one(job: Job, attempt: int) -> None:
                async with semaphore:
                    if self._unavailable.is_set():  # stop rather than fail every remaining job
                        return
                    correct = await self._solve_and_grade(job, attempt, summary)
                summary.correct += bool(correct)
                progress.advance(task)

            await asyncio.gather(*(one(job, attempt) for job, attempt in pending))
        summary.aborted = self._unavailable.is_set()
        return summary

    def _resume_point(self, job: Job, stored: dict[str, Trajectory]) -> tuple[int, Trajectory | None]:
        """(attempt to run, None) or (attempt, the stored trajectory that completes the job)."""
        attempt = 0
        while True:
            found = stored.get(trajectory_id(self.run_id, job.item.id, job.mode, job.sample, attempt))
            if found is None:
                return attempt, None
            if found.status not in RETRIED:
                return attempt, found
            attempt += 1

    async def _solve_and_grade(self, job: Job, attempt: int, summary: RunSummary) -> bool | None:
        request = self.request(job, attempt)
        try:
            final = None
            async for item in self.executor.Solve(request):
                if item.WhichOneof("event") == "final":
                    final = item.final.trajectory
        except grpc.aio.AioRpcError as exc:
            summary.errors.append(f"{job.item.id} {job.mode}: {exc.code().name}: {exc.details()}")
            if exc.code() == grpc.StatusCode.UNAVAILABLE:  # the executor or what it calls is down
                self._unavailable.set()
                return None
            final = await self._get(request.trajectory_id)  # the executor stores failed episodes too
        if final is None:
            return None
        summary.solved += 1
        return await self._grade(job, final)

    async def _get(self, trajectory_id_: str) -> Trajectory | None:
        try:
            return (await self.store.Get(store_pb2.GetRequest(id=trajectory_id_))).trajectory
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    async def _grade(self, job: Job, trajectory: Trajectory) -> bool:
        """Stores the suite's verdict as the trajectory's reward."""
        correct = bool(trajectory.answer.strip()) and self.suite.grade(job.item, trajectory.answer)
        format_valid = trajectory.reward.format_valid if trajectory.HasField("reward") else False
        reward = Reward(
            value=1.0 if correct else 0.0,
            correct=correct,
            format_valid=format_valid,
            kind=CORRECTNESS,
            verifier=verifier_name(self.suite.name),
            components={"r_acc": 1.0 if correct else 0.0},
        )
        await self.store.SetReward(store_pb2.SetRewardRequest(id=trajectory.id, reward=reward))
        return correct

    def _progress(self) -> Progress:
        return Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
            console=self.console, disable=self.console is None,
        )


def eval_mode_of(trajectory: Trajectory) -> str:
    """The evaluation mode a trajectory ran under: its eval_mode label, else from how it was routed."""
    label = trajectory.labels.get(EVAL_MODE_LABEL)
    if label:
        return label
    if trajectory.routing_strategy == RoutingStrategy.ROUTING_STRATEGY_FORCED or trajectory.requested_mode:
        return mode_name(trajectory.requested_mode, unset="auto")
    return "learned" if trajectory.routing_strategy == RoutingStrategy.ROUTING_STRATEGY_LEARNED else "auto"
