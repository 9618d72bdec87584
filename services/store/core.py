"""The trajectory store's logic, free of gRPC: validation, paging, batching, and the hand-off
of blocking database work to worker threads so the event loop never waits on the database."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from gearshift.api.common.v1.common_pb2 import Checkpoint, CheckpointStatus, Reward, Trajectory
from gearshift.errors import InvalidArgument, NotFound, Unavailable
from gearshift.services.store import validation as check
from gearshift.services.store.paging import decode_page_token, encode_page_token
from gearshift.settings import Limits, StoreSettings
from gearshift.storage.repository import Keyset, TrajectoryFilter, TrajectoryRepository
from prometheus_client import Counter, Histogram
from sqlalchemy.exc import OperationalError

T = TypeVar("T")

log = logging.getLogger("gearshift.store")

ROWS_WRITTEN = Counter("gearshift_store_rows_written", "Rows the store wrote, by table (a duplicate trajectory is not one)", ["table"])
WRITE_SECONDS = Histogram("gearshift_store_write_seconds", "Seconds of one database write (one transaction), by operation",
                          ["operation"], buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))


def now_us() -> int:
    return time.time_ns() // 1_000


@dataclass(frozen=True)
class PutResult:
    inserted: int
    duplicates: int


@dataclass(frozen=True)
class Page:
    trajectories: list[Trajectory]
    next_page_token: str


class TrajectoryStore:
    """Stores trajectories and checkpoints through a TrajectoryRepository."""

    def __init__(self, repository: TrajectoryRepository, limits: Limits, store: StoreSettings):
        self.repository = repository
        self.limits = limits
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=store.db_threads, thread_name_prefix="store-db")

    async def _blocking(self, fn: Callable[..., T], *args, **kwargs) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))
        except OperationalError as exc:
            # Lost connections, a database that is down or locked: worth a retry by the caller.
            log.warning("store database unavailable: %s", exc.orig or exc)
            raise Unavailable("the store's database is unavailable; retry later") from exc

    async def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.repository.engine.dispose()

    # trajectories

    async def put(self, batch: list[Trajectory]) -> PutResult:
        """Stores a batch in one transaction, all or nothing; ids already stored are skipped.
        Trajectories without created_at get the current time; times keep microseconds."""
        if len(batch) > self.limits.max_batch:
            raise InvalidArgument(f"batch of {len(batch)} is larger than {self.limits.max_batch}")
        # Checking a batch costs milliseconds of CPU: done on the worker too, off the loop.
        return await self._blocking(self._put, batch)

    def _put(self, batch: list[Trajectory]) -> PutResult:
        for index, trajectory in enumerate(batch):
            try:
                check.check_trajectory(trajectory, self.limits, self.store)
            except InvalidArgument as exc:
                raise InvalidArgument(f"trajectories[{index}] ({trajectory.id[:64] or 'no id'}): {exc}") from None
        stamp = now_us()
        for trajectory in batch:
            created_at = trajectory.created_at
            if trajectory.HasField("created_at"):
                created_at.nanos -= created_at.nanos % 1_000
            else:
                created_at.FromMicroseconds(stamp)
        with WRITE_SECONDS.labels("put").time():
            inserted = self.repository.put(batch)
        ROWS_WRITTEN.labels("trajectories").inc(inserted)
        return PutResult(inserted, len(batch) - inserted)

    async def get(self, trajectory_id: str) -> Trajectory:
        check.check_trajectory_id(trajectory_id)
        trajectory = await self._blocking(self.repository.get, trajectory_id)
        if trajectory is None:
            raise NotFound(f"trajectory {trajectory_id} not found")
        return trajectory

    async def query(self, flt: TrajectoryFilter, page_size: int, page_token: str, include_turns: bool) -> Page:
        """One page, newest first; the token of the last page is empty."""
        check.check_filter(flt, self.store)
        if page_size < 0:
            raise InvalidArgument("page_size is negative")
        size = min(page_size or self.store.default_page_size, self.limits.max_page_size)
        after = decode_page_token(page_token, flt)
        # One row more than asked says whether another page follows.
        rows = await self._blocking(self.repository.query, flt, size + 1, after, include_turns, newest_first=True)
        page, more = rows[:size], len(rows) > size
        token = encode_page_token(Keyset.of(page[-1]), flt) if more else ""
        return Page(page, token)

    async def export(self, flt: TrajectoryFilter, include_turns: bool, limit: int) -> AsyncIterator[Trajectory]:
        """Every match, oldest first, read in chunks so memory stays bounded. Rows added during
        an export appear in it when they sort after the chunk being read."""
        check.check_filter(flt, self.store)
        if limit < 0:
            raise InvalidArgument("limit is negative")
        remaining = limit or None
        after: Keyset | None = None
        while remaining is None or remaining > 0:
            size = self.store.export_chunk_size if remaining is None else min(self.store.export_chunk_size, remaining)
            chunk = await self._blocking(self.repository.query, flt, size, after, include_turns, newest_first=False)
            for trajectory in chunk:
                yield trajectory
            if len(chunk) < size:
                return
            after = Keyset.of(chunk[-1])
            if remaining is not None:
                remaining -= len(chunk)

    async def set_reward(self, trajectory_id: str, reward: Reward) -> Reward | None:
        """Stores the reward; returns the one it replaced, None when the trajectory had none."""
        check.check_trajectory_id(trajectory_id)
        check.check_reward(reward)
        for field in ("kind", "verifier"):
            check.check_label(getattr(reward, field), f"reward.{field}", self.store.max_label_chars)
        return await self._blocking(_written, "set_reward", "rewards", self.repository.set_reward, trajectory_id, reward)

    # checkpoints

    async def register_checkpoint(self, checkpoint: Checkpoint) -> Checkpoint:
        """Records a checkpoint (status CANDIDATE unless given) with its lineage; a retry with
        the same content returns the stored checkpoint (repository.register_checkpoint)."""
        check.check_new_checkpoint(checkpoint, self.store)
        if checkpoint.status == CheckpointStatus.CHECKPOINT_STATUS_UNSPECIFIED:
            checkpoint.status = CheckpointStatus.CHECKPOINT_STATUS_CANDIDATE
        return await self._blocking(_written, "register_checkpoint", "checkpoints", self.repository.register_checkpoint, checkpoint, now_us())

    async def get_checkpoint(self, checkpoint_id: str, include_lineage: bool) -> Checkpoint:
        check.check_checkpoint_id(checkpoint_id)
        checkpoint = await self._blocking(self.repository.get_checkpoint, checkpoint_id, include_lineage)
        if checkpoint is None:
            raise NotFound(f"checkpoint {checkpoint_id} not found")
        return checkpoint

    async def list_checkpoints(self, kind: str, status: int, limit: int) -> list[Checkpoint]:
        if kind and kind not in check.CHECKPOINT_KINDS:
            raise InvalidArgument(f"kind must be empty or one of {', '.join(check.CHECKPOINT_KINDS)}")
        check.check_enum(status, check.CHECKPOINT_STATUSES, "status")
        if limit < 0:
            raise InvalidArgument("limit is negative")
        size = min(limit or self.store.default_checkpoint_limit, self.limits.max_page_size)
        return await self._blocking(self.repository.list_checkpoints, kind, status, size)

    async def update_checkpoint(self, checkpoint_id: str, status: int, metrics: dict[str, float]) -> Checkpoint:
        check.check_checkpoint_id(checkpoint_id)
        check.check_enum(status, check.CHECKPOINT_STATUSES, "status")
        check.check_metrics(metrics, self.store)
        return await self._blocking(_written, "update_checkpoint", "checkpoints", self.repository.update_checkpoint, checkpoint_id, status,
                                    metrics, now_us())


def _written(operation: str, table: str, write: Callable[..., T], *args) -> T:
    """Runs one single-row write (on a database thread), timed and counted."""
    with WRITE_SECONDS.labels(operation).time():
        result = write(*args)
    ROWS_WRITTEN.labels(table).inc()
    return result
