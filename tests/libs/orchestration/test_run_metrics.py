"""The workers' run metrics: every journaled kind has its series before its first run, and
tasks.once counts a run by how it ended and how long it took (the journal on Postgres)."""

from __future__ import annotations

import time

import pytest
from gearshift.orchestration import run_metrics, tasks
from gearshift.orchestration.journal import JobJournal, LeaseLost
from prometheus_client import REGISTRY


def sample(name: str, **labels) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_every_kind_has_its_series_from_the_start():
    for kind in run_metrics.KINDS:
        assert sample("gearshift_worker_runs_running", kind=kind) is not None
        for state in run_metrics.COUNTED:
            assert sample("gearshift_worker_runs_total", kind=kind, state=state) is not None
        for state in run_metrics.ENDED:
            assert sample("gearshift_worker_run_seconds_count", kind=kind, state=state) is not None


def test_once_counts_succeeded_failed_deduplicated_lost_and_parked_runs(monkeypatch, orchestration_db):
    def counted(state: str) -> float:
        return sample("gearshift_worker_runs_total", kind="train", state=state) or 0.0

    def taken_over(lease) -> dict:  # another worker takes the run for dead while it works
        time.sleep(0.1)
        JobJournal(orchestration_db, lease_seconds=0.05).claim(lease.key, "train", {})
        lease.confirm()
        return {}

    before = {state: counted(state) for state in run_metrics.COUNTED}
    monkeypatch.setattr(tasks, "journal", lambda: JobJournal(orchestration_db, lease_seconds=60, max_attempts=1))
    assert tasks.once("k1", "train", {}, lambda lease: {"ok": True})["ok"]
    with pytest.raises(tasks.TaskFailed, match="ZeroDivisionError"):
        tasks.once("k2", "train", {}, lambda lease: 1 / 0)
    assert tasks.once("k1", "train", {}, lambda lease: {})["deduplicated"]
    with pytest.raises(tasks.TaskFailed, match="parked after 1 attempts"):
        tasks.once("k2", "train", {}, lambda lease: {})
    with pytest.raises(LeaseLost):
        tasks.once("k3", "train", {}, taken_over)
    assert {state: counted(state) - before[state] for state in before} == {
        "succeeded": 1, "failed": 1, "deduplicated": 1, "parked": 1, "lost": 1}
    assert sample("gearshift_worker_runs_running", kind="train") == 0
