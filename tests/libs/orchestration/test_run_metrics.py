"""The workers' run metrics: every journaled kind has its series before its first run, and
tasks.once counts a run by how it ended and how long it took."""

from __future__ import annotations

import contextlib

import pytest
from gearshift.orchestration import run_metrics, tasks
from gearshift.orchestration.journal import Claim, JobRun, RunStatus
from prometheus_client import REGISTRY


def sample(name: str, **labels) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


class Book:
    """A journal that lets every run start and records how it ended."""

    def __init__(self, claim: Claim = Claim.NEW):
        self.claim_is, self.ended = claim, []

    def claim(self, key, kind, params):
        return self.claim_is, JobRun(key=key, kind=kind, status=RunStatus.RUNNING, result={"done": 1})

    def kept(self, key):
        return contextlib.nullcontext()

    def succeed(self, key, result, log=None):
        self.ended.append("succeeded")

    def fail(self, key, error, log=None):
        self.ended.append("failed")


def test_every_kind_has_its_series_from_the_start():
    for kind in run_metrics.KINDS:
        assert sample("gearshift_worker_runs_running", kind=kind) is not None
        for state in run_metrics.ENDED:
            assert sample("gearshift_worker_runs_total", kind=kind, state=state) is not None
            assert sample("gearshift_worker_run_seconds_count", kind=kind, state=state) is not None


def test_once_counts_succeeded_failed_and_deduplicated_runs(monkeypatch):
    def counted(state: str) -> float:
        return sample("gearshift_worker_runs_total", kind="train", state=state) or 0.0

    before = {state: counted(state) for state in ("succeeded", "failed", "deduplicated")}
    monkeypatch.setattr(tasks, "journal", lambda: Book())
    assert tasks.once("k1", "train", {}, lambda book, external: {"ok": True})["ok"]
    with pytest.raises(tasks.TaskFailed):
        tasks.once("k2", "train", {}, lambda book, external: 1 / 0)
    monkeypatch.setattr(tasks, "journal", lambda: Book(Claim.DONE))
    assert tasks.once("k1", "train", {}, lambda book, external: {})["deduplicated"]
    assert {state: counted(state) - before[state] for state in before} == {"succeeded": 1, "failed": 1, "deduplicated": 1}
    assert sample("gearshift_worker_runs_running", kind="train") == 0
