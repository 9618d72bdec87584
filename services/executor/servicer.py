"""Executor servicer: streams the episode's events."""

from __future__ import annotations

from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.services.executor.episode import EpisodeRunner


class ExecutorServicer(executor_pb2_grpc.ExecutorServicer):
    def __init__(self, runner: EpisodeRunner):
        self.runner = runner

    async def Solve(self, request: executor_pb2.SolveRequest, context):
        async for item in self.runner.solve(request):
            yield item
