"""The job journal: every orchestration task run as a row in `job_runs`, keyed by a dedupe key.

A task claims its key before any side effect. A second delivery of the same work (Celery's
acks_late redelivers a task whose worker died) then finds the row: finished work returns the
stored result; work another worker is still doing (fresh heartbeat) is left to it; work whose
worker is gone (stale heartbeat) is taken over, and the new attempt finds the `external_id` the
first one recorded (a Job name, a run directory) so it re-attaches instead of starting again.
A worker keeps its heartbeat fresh for as long as it works (`Lease.kept`), however long that is.

The lease is owned. Each claim that runs the work writes an owner token of its own, and every
later write of the run (heartbeat, result, error) matches key and owner. A worker that stalled
past its lease (a long pause, a network partition) and was taken over finds at its next write
that the run is no longer its own (LeaseLost) and stops before its next side effect: only the
new holder trains on, promotes and publishes.

Every lease taken counts an attempt. A run that has had its `max_attempts` is parked instead of
run again: failed, with its last error (or the note that its worker died), so a task that kills
its worker is not redelivered for ever. `retry` gives a parked run its attempts back.
"""

from __future__ import annotations

import logging
import os
import secrets
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
PARKED = "parked after"  # how a parked run's error starts (what an operator searches for)


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
    PARKED = "parked"  # out of attempts: failed for good (until `retry`), do nothing


class LeaseLost(Exception):
    """A write of a run found it no longer held by this owner: another worker took it over (this
    one was taken for dead), or it was parked. The work must stop before its next side effect."""

    def __init__(self, key: str, owner: str, holder: str = ""):
        super().__init__(key, owner, holder)
        self.key, self.owner, self.holder = key, owner, holder

    def __str__(self) -> str:
        now = f"; now {self.holder}" if self.holder else ""
        return f"lease on {self.key} lost: {self.owner} no longer holds it{now}"


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


def new_owner() -> str:
    """An owner token: the worker, and a random part, since one process takes leases more than
    once (a retried task, a copy that lost its lease and later claims the key again)."""
    return f"{this_worker()}:{secrets.token_hex(4)}"


class JobJournal:
    """Job runs in the store's database (Postgres in production, the SQLite file embedded)."""

    def __init__(self, engine: Engine, lease_seconds: float = 60.0, max_attempts: int = 3):
        self.engine = engine
        self.lease_us = int(lease_seconds * 1e6)
        self.max_attempts = max_attempts

    def claim(self, key: str, kind: str, params: dict) -> tuple[Claim, JobRun]:
        """Records the run (or finds it) before any side effect; says what to do next. A run to
        do (NEW, TAKEN_OVER) comes back with this claim's owner token: pass it to Lease."""
        stamp, owner = now_us(), new_owner()
        row = {
            "key": key, "kind": kind, "status": RunStatus.RUNNING.value, "params": params, "result": {},
            "external_id": "", "log": "", "error": "", "attempts": 1, "owner": owner,
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
            if current.attempts >= self.max_attempts:
                return Claim.PARKED, self._park(connection, current, stamp)
            # A crashed or failed attempt: this worker takes the run over (the heartbeat it sets
            # makes a third delivery see it as busy). Only if the row is as read: SQLite has no
            # row lock, and two takers must not both run.
            taken = connection.execute(
                update(job_runs)
                .where(*_as_read(current))
                .values(status=RunStatus.RUNNING.value, attempts=current.attempts + 1, owner=owner, heartbeat_at_us=stamp,
                        error="", finished_at_us=None)
            ).rowcount
            connection.commit()
        if not taken:
            return Claim.BUSY, self._read_now(key)
        current.status, current.attempts, current.owner, current.error = RunStatus.RUNNING, current.attempts + 1, owner, ""
        return Claim.TAKEN_OVER, current

    def get(self, key: str) -> JobRun | None:
        with self.engine.connect() as connection:
            try:
                return self._read(connection, key)
            except LookupError:
                return None

    def heartbeat(self, key: str, owner: str, external_id: str | None = None, log: str | None = None) -> None:
        """Keeps the lease; records what the run started outside and the tail of its log."""
        values: dict = {"heartbeat_at_us": now_us()}
        if external_id is not None:
            values["external_id"] = external_id
        if log is not None:
            values["log"] = log[-MAX_LOG_CHARS:]
        self._update_owned(key, owner, values)

    def succeed(self, key: str, owner: str, result: dict, log: str | None = None) -> None:
        values = {"status": RunStatus.SUCCEEDED.value, "result": result, "finished_at_us": now_us(), "heartbeat_at_us": now_us()}
        if log is not None:
            values["log"] = log[-MAX_LOG_CHARS:]
        self._update_owned(key, owner, values)

    def fail(self, key: str, owner: str, error: str, log: str | None = None) -> None:
        values = {"status": RunStatus.FAILED.value, "error": error[:4000], "finished_at_us": now_us()}
        if log is not None:
            values["log"] = log[-MAX_LOG_CHARS:]
        self._update_owned(key, owner, values)

    def retry(self, key: str) -> bool:
        """Gives a failed run (a parked one) its attempts back, so the next delivery of its task
        runs it again; False when no failed run has that key."""
        with self.engine.connect().execution_options(**{WRITE: True}) as connection:
            reset = connection.execute(
                update(job_runs).where(job_runs.c.key == key, job_runs.c.status == RunStatus.FAILED.value).values(attempts=0)
            ).rowcount
            connection.commit()
        return bool(reset)

    def parked(self, limit: int = 50) -> list[JobRun]:
        """Runs out of attempts, newest first."""
        query = select(job_runs).where(job_runs.c.status == RunStatus.FAILED.value, job_runs.c.error.startswith(PARKED))
        with self.engine.connect() as connection:
            rows = connection.execute(query.order_by(job_runs.c.created_at_us.desc()).limit(limit)).mappings().all()
        return [_run(row) for row in rows]

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

    def _park(self, connection, current: JobRun, stamp: int) -> JobRun:
        """Fails a run out of attempts for good, naming why its last attempt ended."""
        if current.status == RunStatus.FAILED and current.error.startswith(PARKED):
            return current
        if current.status == RunStatus.RUNNING:
            last = f"its worker died (no heartbeat for {(stamp - current.heartbeat_at_us) / 1e6:.1f} s, lease {self.lease_us / 1e6:g} s)"
        else:
            last = current.error
        error = f"{PARKED} {current.attempts} attempts (orchestration.max_attempts {self.max_attempts}); the last: {last}"[:4000]
        connection.execute(
            update(job_runs).where(*_as_read(current)).values(status=RunStatus.FAILED.value, error=error, finished_at_us=stamp)
        )
        connection.commit()
        current.status, current.error, current.finished_at_us = RunStatus.FAILED, error, stamp
        return current

    def _update_owned(self, key: str, owner: str, values: dict) -> None:
        with self.engine.connect().execution_options(**{WRITE: True}) as connection:
            matched = connection.execute(
                update(job_runs)
                .where(job_runs.c.key == key, job_runs.c.owner == owner, job_runs.c.status == RunStatus.RUNNING.value)
                .values(**values)
            ).rowcount
            connection.commit()
        if not matched:
            now = self.get(key)
            raise LeaseLost(key, owner, f"{now.owner}, attempt {now.attempts}, {now.status}" if now else "no such run")

    def _read_now(self, key: str) -> JobRun:
        with self.engine.connect() as connection:
            return self._read(connection, key)

    @staticmethod
    def _read(connection, key: str, lock: bool = False) -> JobRun:
        query = select(job_runs).where(job_runs.c.key == key)
        if lock and connection.dialect.name == "postgresql":
            query = query.with_for_update()  # two takers of a stale run: one waits, then sees it busy
        row = connection.execute(query).mappings().first()
        if row is None:
            raise LookupError(key)
        return _run(row)


@dataclass
class Lease:
    """A run this worker claimed to do (Claim.NEW or TAKEN_OVER), held by the claim's owner token.
    Every write goes through it, so a holder that was taken for dead learns so (LeaseLost) at its
    next write rather than after it published."""

    journal: JobJournal
    run: JobRun
    lost: threading.Event = field(default_factory=threading.Event)  # set once any write found the lease lost

    @property
    def key(self) -> str:
        return self.run.key

    @property
    def owner(self) -> str:
        return self.run.owner

    def heartbeat(self, external_id: str | None = None, log: str | None = None) -> None:
        self._owned(self.journal.heartbeat, external_id=external_id, log=log)

    def confirm(self) -> None:
        """Before a step no second copy may take too (promote, publish): renews the lease, or
        raises LeaseLost when another worker holds the run now. It asks the database even when
        `lost` is set, so the error names the holder."""
        self.heartbeat()

    def succeed(self, result: dict, log: str | None = None) -> None:
        self._owned(self.journal.succeed, result, log=log)

    def fail(self, error: str, log: str | None = None) -> None:
        self._owned(self.journal.fail, error, log=log)

    @contextmanager
    def kept(self) -> Iterator[None]:
        """Heartbeats the run from a thread, three times a lease, while the block runs: work that
        reports no progress of its own (an evaluation, a rollout) keeps its lease, so a copy of
        its task handed to another worker meanwhile finds it busy rather than crashed. A beat
        that finds the lease lost sets `lost` and beats no more: the work stops at its next
        confirm() or write."""
        stop = threading.Event()

        def keep() -> None:
            while not stop.wait(self.journal.lease_us / 3e6):
                try:
                    self.heartbeat()
                except LeaseLost as lost:
                    logger.warning("%s: the work stops at its next step", lost)
                    return
                except SQLAlchemyError as error:  # the database briefly away: the next beat may reach it
                    logger.warning("heartbeat of %s failed: %s", self.key, error)

        thread = threading.Thread(target=keep, name=f"lease {self.key}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _owned(self, write, *args, **kwargs) -> None:
        try:
            write(self.key, self.owner, *args, **kwargs)
        except LeaseLost:
            self.lost.set()
            raise


def _as_read(run: JobRun) -> tuple:
    """Matches the row only if no one changed its holder since it was read (attempts and owner
    change with every lease taken)."""
    return job_runs.c.key == run.key, job_runs.c.owner == run.owner, job_runs.c.attempts == run.attempts


def _run(row) -> JobRun:
    values = dict(row)
    values["status"] = RunStatus(values["status"])
    return JobRun(**values)
