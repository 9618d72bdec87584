"""One chat completion over one Solve call: whole, or as server-sent events in OpenAI's
`chat.completion.chunk` shape ending `data: [DONE]`. A client that goes away cancels the call,
and the executor stores the episode as cancelled."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import TypeVar

import grpc
from fastapi import Request
from fastapi.responses import StreamingResponse
from gearshift import tracing
from gearshift.api.common.v1.common_pb2 import Trajectory
from gearshift.http_server import ClientGone, unless_disconnected
from gearshift.interceptors import request_id
from gearshift.services.gateway import translate
from gearshift.openai_http import ApiError, ending_with_done, sse
from gearshift.services.gateway.errors import from_rpc
from gearshift.services.gateway.middleware import GatewayMetrics
from gearshift.services.gateway.deltas import Delta

log = logging.getLogger("gearshift.gateway")
T = TypeVar("T")


@dataclass
class Completion:
    """A completion request under way: its Solve call and what the client has been told."""

    call: grpc.aio.UnaryStreamCall
    view: translate.EpisodeView
    model: str
    created: int
    include_usage: bool
    metrics: GatewayMetrics

    @property
    def meta(self) -> dict:
        return {"id": translate.completion_id(self.view.trajectory_id), "object": "chat.completion.chunk",
                "created": self.created, "model": self.model}

    async def whole(self, request: Request) -> dict:
        """Runs the episode to its end; the completion object."""
        trajectory = await _unless_disconnected(request, self._run(), self)
        return translate.completion(trajectory, self.model, self.created, self.view.routing_seconds, self.view.stop.words)

    async def first_event(self, request: Request) -> Delta:
        """Waits for the mode decision, so that a refused request is an HTTP error, not an error
        event in a stream already answered 200."""
        return await _unless_disconnected(request, self._next(), self)

    def stream(self, first: Delta, headers: dict) -> StreamingResponse:
        return EventStream(self._events(first), media_type="text/event-stream", headers={"Cache-Control": "no-cache", **headers})

    def cancel(self) -> None:
        """Cancels the Solve call unless the episode is over (its status may still be on the way)."""
        if self.view.trajectory is None and not self.call.done():
            self.call.cancel()
            self.metrics.cancelled.labels(self.model).inc()

    async def _next(self) -> Delta:
        """The next event, as what it tells the client."""
        try:
            event = await self.call.read()
        except grpc.aio.AioRpcError as exc:
            raise from_rpc(exc, "executor", request_id.get()) from None
        if event is grpc.aio.EOF:
            raise ApiError(502, "executor: the stream ended before the episode did")
        delta = self.view.on_event(event)
        if event.WhichOneof("event") == "final":  # the request's span (the trace's root) and log lines say which episode it was
            tracing.describe_episode(self.view.trajectory)
        if event.WhichOneof("event") == "mode_chosen":
            self.metrics.routing.labels(self.model).observe(self.view.routing_seconds)
        return delta

    async def _run(self) -> Trajectory:
        while self.view.trajectory is None:
            await self._next()
        return self.view.trajectory

    def _chunk(self, delta: dict, finish: str | None = None) -> dict:
        return {**self.meta, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    def _deltas(self, delta: Delta) -> list[str]:
        out = [sse(self._chunk({"reasoning_content": delta.reasoning}))] if delta.reasoning else []
        return out + ([sse(self._chunk({"content": delta.content}))] if delta.content else [])

    async def _events(self, first: Delta) -> AsyncIterator[str]:
        try:
            async for text in ending_with_done(self._episode(first), log):
                yield text
        finally:
            self.cancel()  # only if still running: the client went away

    async def _episode(self, first: Delta) -> AsyncIterator[str]:
        yield sse(self._chunk({"role": "assistant", "content": ""}))
        for text in self._deltas(first):
            yield text
        while self.view.trajectory is None:
            for text in self._deltas(await self._next()):
                yield text
        for text in self._closing(self.view.trajectory):
            yield text

    def _closing(self, trajectory: Trajectory) -> list[str]:
        """The chunk with the finish reason, then usage when asked for; the last one carries the
        gearshift extension."""
        extension = {"gearshift": translate.extension(trajectory, self.view.routing_seconds)}
        finish = self._chunk({}, translate.finish_reason(trajectory))
        if not self.include_usage:
            return [sse(finish | extension)]
        return [sse(finish), sse({**self.meta, "choices": [], "usage": translate.usage(trajectory)} | extension)]


class EventStream(StreamingResponse):
    """A StreamingResponse that closes its events however it ends: a client that went away
    while an event was being written leaves the generator suspended at its yield otherwise,
    and its Solve call running."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


async def _unless_disconnected(request: Request, work: Awaitable[T], completion: Completion) -> T:
    """Awaits work, cancelling the Solve call when the client hangs up."""
    try:
        return await unless_disconnected(request, work)
    except (ClientGone, asyncio.CancelledError):
        completion.cancel()
        raise
