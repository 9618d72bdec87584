"""Executor servicer: streams the episode's events, and at the drain's end stores the episodes
still running as CANCELLED before the process exits."""

from __future__ import annotations

import asyncio
import contextlib
import time

from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.services.executor.episode import EpisodeRunner
from gearshift.services.executor.metrics import EPISODES_IN_FLIGHT

END = None  # queued after the episode's last event, whether it finished or failed
# How long the episodes still running at the drain's end have to store themselves CANCELLED (the
# store's Put, then the spool) before the process exits. The chart leaves 5 s between the drain's
# end (GEARSHIFT_GRACE_SECONDS) and SIGKILL; the health notice before the drain takes 1 of them.
SHUTDOWN_SAVE_SECONDS = 3.0


class ExecutorServicer(executor_pb2_grpc.ExecutorServicer):
    def __init__(self, runner: EpisodeRunner):
        self.runner = runner
        self._episodes: set[asyncio.Task] = set()

    async def Solve(self, request: executor_pb2.SolveRequest, context):
        # The episode runs as its own task and hands its events over through a queue, so that it
        # goes on with its next call while gRPC writes an event to the client (a write waits for
        # its completion). The queue holds no more than the episode's own events.
        events: asyncio.Queue[executor_pb2.SolveEvent | None] = asyncio.Queue()
        episode = asyncio.create_task(self._run(request, events))
        self._episodes.add(episode)
        episode.add_done_callback(self._episodes.discard)
        EPISODES_IN_FLIGHT.inc()
        try:
            while (item := await events.get()) is not END:
                yield item
            await episode  # raises the episode's error, if it failed
        finally:
            if not episode.done():  # the client went away: the episode stores itself as cancelled
                episode.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await episode
            EPISODES_IN_FLIGHT.dec()

    async def _run(self, request: executor_pb2.SolveRequest, events: asyncio.Queue) -> None:
        try:
            async for item in self.runner.solve(request):
                events.put_nowait(item)
        finally:
            events.put_nowait(END)

    async def stop(self, seconds: float = SHUTDOWN_SAVE_SECONDS) -> None:
        """The drain's end (gRPC has cancelled the calls still running, and their handlers may not
        have seen it yet): every episode still running is cancelled, and stores itself CANCELLED
        with the turns it finished, through the durable store, which gives up on the store in time
        to spool it instead. Returns when all are kept, or after seconds."""
        until = time.monotonic() + seconds
        self.runner.stored.hurry(seconds)
        running = set(self._episodes)
        for episode in running:
            episode.cancel()
        if running:
            await asyncio.wait(running, timeout=seconds)
        await self.runner.saved(max(0.0, until - time.monotonic()))
