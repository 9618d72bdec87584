"""The job journal: every orchestration task run as a row in `job_runs`, keyed by a dedupe key.

A task claims its key before any side effect. A second delivery of the same work (Celery's
acks_late redelivers a task whose worker died) then finds the row: finished work returns the
stored result; work another worker is still doing (fresh heartbeat) is left to it; work whose
worker is gone (stale heartbeat) is taken over, and the new attempt finds the `external_id` the
first one recorded (a Job name, a run directory) so it re-attaches instead of starting again.
A worker keeps its heartbeat fresh for as long as it works (`kept`), however long that is.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from gearshift.storage.database import WRITE
from gearshift.storage.models import job_runs

logger = logging.getLogger(__name__)

MAX_LOG_CHARS = 64_000  # the tail of a run's log kept in the row; the whole log stays on disk


class RunStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class Claim(StrEnum):
    """What a task should do with its key."""

    NEW = "new"  # first run: do the work
    TAKEN_OVER = "taken_over"  # a crashed attempt: do the work, re-attaching to what it started
    DONE = "done"  # already succeeded: return the stored result
    BUSY = "busy"  # another live worker is on it: do nothing


@dataclass
class JobRun:
    """One row of job_runs."""

    key: str
    kind: str
    status: RunStatus
    params: dict = field(default_factory=dict)
    result: dict = field(default_factory=dict)
    external_id: str = ""
    log: str = ""
    error: str = ""
    attempts: int = 1
    owner: str = ""
    created_at_us: int = 0
    heartbeat_at_us: int = 0
    finished_at_us: int | None = None


def now_us() -> int:
    return time.time_ns() // 1000


def this_worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class JobJournal:
    """Job runs in the store's database (Postgres in production, the SQLite file embedded)."""

    def __init__(self, engine: Engine, lease_seconds: float = 60.0):
        self.engine = engine
        self.lease_us = int(lease_seconds * 1e6)

    def claim(self, key: str, kind: str, params: dict) -> tuple[Claim, JobRun]:
        """Records the run (or finds it) before any side effect; says what to do next."""
        stamp = now_us()
        row = {
            "key": key, "kind": kind, "status": RunStatus.RUNNING.value, "params": params, "result": {},
            "external_id": "", "log": "", "error": "", "attempts": 1, "owner": this_worker(),
            "created_at_us": stamp, "heartbeat_at_us": stamp, "finished_at_us": None,
        }
        try:
            with self.engine.connect().execution_options(**{WRITE: True}) as connection:
                connection.execute(insert(job_runs).values(**row))
                connection.commit()
            return Claim.NEW, JobRun(**row | {"status": RunStatus.RUNNING})
        except IntegrityError:
            pass
        with self.engine.connect().execution_options(**{WRITE: True}) as connection:
            current = self._read(connection, key, lock=True)
            if current.status == RunStatus.SUCCEEDED:
                return Claim.DONE, current
            if current.status == RunStatus.RUNNING and stamp - current.heartbeat_at_us < self.lease_us:
                return Claim.BUSY, current
            # A crashed or failed attempt: this worker takes the run over (the heartbeat it sets
            # makes a third delivery see it as busy).
            connection.execute(
                update(job_runs)
                .where(job_runs.c.key == key)
                .values(status=RunStatus.RUNNING.value, attempts=current.attempts + 1, owner=this_worker(), heartbeat_at_us=stamp, error="")
            )
            connection.commit()
        current.status, current.attempts, current.owner = RunStatus.RUNNING, current.attempts + 1, this_worker()
        return Claim.TAKEN_OVER, current

    def get(self, key: str) -> JobRun | None:
        with self.engine.connect() as connection:
            try:
                return self._read(connection, key)
            except LookupError:
                return None

    def heartbeat(self, key: str, external_id: str | None = None, log: str | None = None) -> None:
        """Keeps the lease; records what the run started outside and the tail of its log."""
        values: dict = {"heartbeat_at_us": now_us()}
        if external_id is not None:
            values["external_id"] = external_id
        if log is not None:
            values["log"] = log[-MAX_LOG_CHARS:]
        self._update(key, values)

    @contextmanager
    def kept(self, key: str) -> Iterator[None]:
        """Heartbeats the key from a thread, three times a lease, while the block runs: work that
        reports no progress of its own (an evaluation, a rollout) keeps its lease, so a copy of
        its task handed to another worker meanwhile finds it busy rather than crashed."""
        stop = threading.Event()

        def keep() -> None:
            while not stop.wait(self.lease_us / 3e6):
                try:
                    self.heartbeat(key)
                except SQLAlchemyError as error:  # the database briefly away: the next beat may reach it
                    logger.warning("heartbeat of %s failed: %s", key, error)

        thread = threading.Thread(target=keep, name=f"lease {key}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def succeed(self, key: str, result: dict, log: str | None = None) -> None:
        values = {"status": RunStatus.SUCCEEDED.value, "result": result, "finished_at_us": now_us(), "heartbeat_at_us": now_us()}
        if log is not None:
            values["log"] = log[-MAX_LOG_CHARS:]
        self._update(key, values)

    def fail(self, key: str, error: str, log: str | None = None) -> None:
        values = {"status": RunStatus.FAILED.value, "error": error[:4000], "finished_at_us": now_us()}
        if log is not None:
            values["log"] = log[-MAX_LOG_CHARS:]
        self._update(key, values)

    def latest(self, kind: str, status: RunStatus | None = None) -> JobRun | None:
        """The newest run of a kind (optionally with a status)."""
        query = select(job_runs).where(job_runs.c.kind == kind)
        if status is not None:
            query = query.where(job_runs.c.status == status.value)
        with self.engine.connect() as connection:
            row = connection.execute(query.order_by(job_runs.c.created_at_us.desc()).limit(1)).mappings().first()
        return _run(row) if row else None

    def list(self, kind: str | None = None, limit: int = 50) -> list[JobRun]:
        query = select(job_runs)
        if kind:
            query = query.where(job_runs.c.kind == kind)
        with self.engine.connect() as connection:
            rows = connection.execute(query.order_by(job_runs.c.created_at_us.desc()).limit(limit)).mappings().all()
        return [_run(row) for row in rows]

    def _update(self, key: str, values: dict) -> None:
        with self.engine.connect().execution_options(**{WRITE: True}) as connection:
            connection.execute(update(job_runs).where(job_runs.c.key == key).values(**values))
            connection.commit()

    @staticmethod
    def _read(connection, key: str, lock: bool = False) -> JobRun:
        query = select(job_runs).where(job_runs.c.key == key)
        if lock and connection.dialect.name == "postgresql":
            query = query.with_for_update()  # two takers of a stale run: one waits, then sees it busy
        row = connection.execute(query).mappings().first()
        if row is None:
            raise LookupError(key)
        return _run(row)


def _run(row) -> JobRun:
    values = dict(row)
    values["status"] = RunStatus(values["status"])
    return JobRun(**values)
