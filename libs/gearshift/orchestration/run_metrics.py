"""The Celery workers' Prometheus metrics of journaled runs (tasks.once): how many ended in each
state and how long they took, by kind. Served with the queue lengths on orchestration.metrics_port."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Every kind a task journals (tasks.once): their series exist from the start, so a dashboard and
# an alert read 0 rather than nothing before the first run.
KINDS = ("score", "snapshot", "train", "promote", "publish")
ENDED = ("succeeded", "failed", "lost")  # lost: another worker took the run over (its lease) and finishes it
COUNTED = (*ENDED, "deduplicated", "parked")  # parked: out of attempts, not run (journal.py)
RUN_BUCKETS = (0.1, 0.5, 1, 5, 15, 60, 300, 900, 1800, 3600, 7200, 14400, 43200)

RUNS = Counter("gearshift_worker_runs", "Journaled runs by kind and state (succeeded, failed, lost: taken over by another worker, "
               "deduplicated: already done, parked: out of attempts)", ["kind", "state"])
RUNS_RUNNING = Gauge("gearshift_worker_runs_running", "Journaled runs this worker is doing now", ["kind"])
RUN_SECONDS = Histogram("gearshift_worker_run_seconds", "Seconds a run took on this worker, by kind and how it ended",
                        ["kind", "state"], buckets=RUN_BUCKETS)

for _kind in KINDS:
    RUNS_RUNNING.labels(_kind)
    for _state in COUNTED:
        RUNS.labels(_kind, _state)
    for _state in ENDED:
        RUN_SECONDS.labels(_kind, _state)


def ended(kind: str, state: str, seconds: float) -> None:
    RUNS.labels(kind, state).inc()
    RUN_SECONDS.labels(kind, state).observe(seconds)
