"""How a finished trajectory reaches the store, durably, before its episode is acknowledged.

The Put is retried with backoff while the store or its database is unavailable, for
store_retry_seconds; then, or at once when the store fails otherwise, the trajectory goes to the
spool (spool.py), on the executor's own volume, and the episode is acknowledged: its work is kept
either way. Only a trajectory the store refuses as invalid fails its episode, as before. A replay task drains the
spool into the store, oldest first, once the store answers. While the spool holds anything, new
trajectories join it rather than overtake it; when the replay, the store answering again, sends
the spool's last entries, those that finish meanwhile wait for that Put and then go to the store
directly, so that under a steady load the spool empties (it would otherwise always hold the few
that finished during the last Put, and every trajectory would take the detour).

An episode is counted in the metrics (metrics.record_episode) when the store has it, by the Put or
by the replay: an outage shows as episodes missing from the counts and a growing spool, not as
episodes counted and lost.

A Put's retries also end with the deadline of the work in hand (the episode's wrap-up margin),
and when the executor stops (hurry) every Put gives up on the store at a cutoff a few seconds
away, so that the episodes its drain cut reach the spool before the process exits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc
from gearshift import deadlines
from gearshift.api.common.v1.common_pb2 import Trajectory
from gearshift.api.store.v1 import store_pb2, store_pb2_grpc
from gearshift.services.executor import metrics
from gearshift.services.executor.spool import Entry, Spool
from gearshift.settings import ExecutorSettings

log = logging.getLogger("gearshift.executor")

# The store or its database is down, or did not answer in time: the trajectory may be taken later.
UNAVAILABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
FIRST_BACKOFF_SECONDS = 0.1
MAX_PUT_BACKOFF_SECONDS = 2.0
LAST_ATTEMPT_SECONDS = 1.0  # the least time a Put attempt is given, the last one included
REPLAY_BATCH = 64  # trajectories per replayed Put: a long outage's spool drains in batches
REPLAY_MAX_BYTES = 8 * 1024 * 1024  # and no more bytes than this in one (far below the message limit)
SPOOL_WRITE_SECONDS = 0.5  # kept after a stopping executor's cutoff for the spool's write


class DurableStore:
    """The store's Put for finished trajectories, with the spool behind it."""

    def __init__(self, store: store_pb2_grpc.TrajectoryStoreStub, spool: Spool, config: ExecutorSettings):
        self.store = store
        self.spool = spool
        self.config = config
        self._waiting = asyncio.Event()  # set while the spool holds something
        self._replay: asyncio.Task | None = None
        self._handover: asyncio.Future | None = None  # the replay's Put of the spool's last entries, while under way
        self._store_answers = False  # the replay's last Put reached the store: the next may hand over
        self._cutoff: float | None = None  # the executor is stopping: no Put goes on past this time.monotonic()
        self._attempts: set[asyncio.Task] = set()  # Puts under way
        if len(spool):
            self._waiting.set()

    async def put(self, trajectory: Trajectory) -> bool:
        """Stores the trajectory or spools it; True when the store took it now."""
        if self._handover is not None:
            await asyncio.shield(self._handover)
        if not len(self.spool):
            failed = await self._put_with_retries(trajectory)
            if failed is None:
                metrics.record_episode(trajectory)
                return True
            if not len(self.spool):
                log.warning("the store did not take a trajectory (%s): finished trajectories go to the spool at %s until it does",
                            failed.name, self.spool.directory)
        await self.spool.append(trajectory)
        metrics.SPOOL_TRAJECTORIES.labels("spooled").inc()
        self._waiting.set()
        return False

    async def spooled(self, trajectory_id: str) -> Trajectory | None:
        """The trajectory of that id if it waits in the spool (its episode ran and was acknowledged)."""
        return await self.spool.trajectory(trajectory_id)

    async def _put_with_retries(self, trajectory: Trajectory) -> grpc.StatusCode | None:
        """None once the store took it; else the status of the last attempt, when the store was
        unavailable for the whole retry budget, another trajectory went to the spool meanwhile
        (this one then follows it there), or the store failed otherwise (a fault of its own, a
        token it does not accept: the trajectory is kept until it takes it)."""
        request = store_pb2.PutRequest(trajectories=[trajectory])
        window, left = self.config.store_retry_seconds, deadlines.remaining()
        deadline = time.monotonic() + (window if left is None else max(0.0, min(window, left)))
        backoff = FIRST_BACKOFF_SECONDS
        while True:
            failed = await self._attempt(request, max(self._end(deadline) - time.monotonic(), LAST_ATTEMPT_SECONDS))
            if failed not in UNAVAILABLE:
                return failed  # None: taken
            left = self._end(deadline) - time.monotonic()
            if left <= 0 or len(self.spool):
                return failed
            await asyncio.sleep(min(backoff, left))
            backoff = min(backoff * 2, MAX_PUT_BACKOFF_SECONDS)

    async def _attempt(self, request: store_pb2.PutRequest, timeout: float) -> grpc.StatusCode | None:
        """One Put: None when the store took it, else the status it failed with (DEADLINE_EXCEEDED
        for one still under way at a stopping executor's cutoff, given up then)."""
        attempt = asyncio.ensure_future(self.store.Put(request, timeout=timeout))
        self._attempts.add(attempt)
        if self._cutoff is not None:
            self._give_up_at_cutoff(attempt)
        try:
            await asyncio.wait({attempt})
        except asyncio.CancelledError:
            attempt.cancel()
            raise
        finally:
            self._attempts.discard(attempt)
        if attempt.cancelled():
            return grpc.StatusCode.DEADLINE_EXCEEDED
        exc = attempt.exception()
        if exc is None:
            return None
        if not isinstance(exc, grpc.aio.AioRpcError) or exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
            raise exc  # INVALID_ARGUMENT: the store refused the trajectory itself, and would refuse a spooled copy too
        return exc.code()

    def _end(self, deadline: float) -> float:
        return deadline if self._cutoff is None else min(deadline, self._cutoff)

    def _give_up_at_cutoff(self, attempt: asyncio.Task) -> None:
        asyncio.get_running_loop().call_later(max(0.0, self._cutoff - time.monotonic()), attempt.cancel)

    def hurry(self, seconds: float) -> None:
        """The executor is stopping: Puts under way and to come give up on the store in time for
        their trajectories to reach the spool within seconds; the replay stops (what it has not
        replayed waits in the spool for the next start)."""
        self._cutoff = time.monotonic() + max(0.0, seconds - SPOOL_WRITE_SECONDS)
        for attempt in self._attempts:
            self._give_up_at_cutoff(attempt)
        if self._replay is not None:
            self._replay.cancel()

    # the replay

    def wake(self) -> None:
        """The spool may hold entries the replay has not seen (adopted from an executor that is gone)."""
        if len(self.spool):
            self._waiting.set()

    def start(self) -> None:
        self._replay = asyncio.create_task(self._replay_forever(), name="spool-replay")

    async def close(self) -> None:
        """Stops the replay; what is left stays in the spool for the next start."""
        if self._replay is not None:
            self._replay.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay
        self._end_handover()
        await self.spool.close()

    async def _replay_forever(self) -> None:
        backoff = FIRST_BACKOFF_SECONDS
        replayed, started = 0, None
        while True:
            await self._waiting.wait()
            started = started or time.monotonic()
            try:
                taken = await self._replay_oldest()
            except Exception:  # noqa: BLE001 - the replay must outlive a bad file or a full disk: it is the only way out of the spool
                log.exception("spool replay failed; retrying")
                taken = 0
            if taken:
                replayed, backoff = replayed + taken, FIRST_BACKOFF_SECONDS
            elif len(self.spool):
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.config.spool_replay_max_backoff_seconds)
            if not len(self.spool):
                self._waiting.clear()
                if replayed:
                    log.info("spool drained: %d trajectories replayed into the store; it held trajectories for %.1f s",
                             replayed, time.monotonic() - started)
                replayed, started = 0, None

    async def _replay_oldest(self) -> int:
        """Puts the oldest batch; returns how many left the spool (0: the store is still unavailable)."""
        if self._store_answers and len(self.spool) <= REPLAY_BATCH:
            # The last entries: trajectories that finish now wait for their Put rather than join
            # them, and the writes under way land first, so that this batch empties the spool.
            self._handover = asyncio.get_running_loop().create_future()
            await self.spool.written()
        try:
            batch = await self.spool.read(self.spool.oldest(REPLAY_BATCH), REPLAY_MAX_BYTES)
            if not batch:
                return 0
            try:
                request = store_pb2.PutRequest(trajectories=[trajectory for _, trajectory in batch])
                await self.store.Put(request, timeout=self.config.store_retry_seconds)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    return await self._replay_one_by_one(batch)
                self._store_answers = False
                return 0  # unavailable, or a fault of the store's that may pass: the entries wait
            self._store_answers = True
            await self._taken(batch)
            return len(batch)
        finally:
            self._end_handover()

    def _end_handover(self) -> None:
        if self._handover is not None:
            self._handover.set_result(None)
            self._handover = None

    async def _replay_one_by_one(self, batch: list[tuple[Entry, Trajectory]]) -> int:
        """A Put takes a batch whole or not at all: one the store refuses is found alone and set
        aside, so that it does not hold up every trajectory behind it."""
        done = 0
        for entry, trajectory in batch:
            try:
                await self.store.Put(store_pb2.PutRequest(trajectories=[trajectory]))
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
                    return done
                where = self.spool.set_aside(entry)
                metrics.SPOOL_TRAJECTORIES.labels("refused").inc()
                log.error("the store refused spooled trajectory %s (%s): set aside at %s", entry.trajectory_id, exc.details(), where)
            else:
                await self._taken([(entry, trajectory)])
            done += 1
        return done

    async def _taken(self, batch: list[tuple[Entry, Trajectory]]) -> None:
        await self.spool.remove([entry for entry, _ in batch])
        metrics.SPOOL_TRAJECTORIES.labels("replayed").inc(len(batch))
        for _, trajectory in batch:
            metrics.record_episode(trajectory)
