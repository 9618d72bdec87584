"""Executor servicer: streams the episode's events."""

from __future__ import annotations

import asyncio
import contextlib

from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.services.executor.episode import EpisodeRunner
from gearshift.services.executor.metrics import EPISODES_IN_FLIGHT

END = None  # queued after the episode's last event, whether it finished or failed


class ExecutorServicer(executor_pb2_grpc.ExecutorServicer):
    def __init__(self, runner: EpisodeRunner):
        self.runner = runner

    async def Solve(self, request: executor_pb2.SolveRequest, context):
        # The episode runs as its own task and hands its events over through a queue, so that it
        # goes on with its next call while gRPC writes an event to the client (a write waits for
        # its completion). The queue holds no more than the episode's own events.
        events: asyncio.Queue[executor_pb2.SolveEvent | None] = asyncio.Queue()
        episode = asyncio.create_task(self._run(request, events))
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
