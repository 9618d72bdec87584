"""The HTTP face of the policy engine: OpenAI-compatible routes, server-sent events, and errors
in OpenAI's shape (bad input is a 400 with a message, never a crash)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import asdict
from typing import TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from gearshift.errors import GearshiftError, InvalidArgument, NotFound, ResourceExhausted, Unauthenticated, Unavailable
from gearshift.services.policy_server.core import Generation, PolicyEngine
from gearshift.services.policy_server.generation import GenerationResult
from gearshift.services.policy_server.parsing import OutputSplitter, Piece, split_output
from gearshift.services.policy_server.schemas import ChatCompletionRequest, CompletionRequest, LoadRequest, SamplingFields
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger("gearshift.policy_server.http")
T = TypeVar("T")
DISCONNECT_POLL_SECONDS = 0.2

HTTP_STATUS = {InvalidArgument: 400, Unauthenticated: 401, NotFound: 404, ResourceExhausted: 429, Unavailable: 503}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}


def error_response(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    kind = ERROR_TYPES.get(status, "server_error")
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status, headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors():
        if error.get("type") == "json_invalid":
            return f"malformed JSON body: {error.get('ctx', {}).get('error', error.get('msg'))}"
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        parts.append(f"{where or 'body'}: {error.get('msg')}")
    return "; ".join(parts) or "invalid request"


def _usage(results: list[GenerationResult]) -> dict:
    prompt = sum(r.prompt_tokens for r in results)
    completion = sum(r.completion_tokens for r in results)
    cached = sum(r.cached_tokens for r in results)  # as OpenAI and vLLM report prefix-cache hits
    return {
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _token_ids(body: SamplingFields, result: GenerationResult) -> dict:
    """vLLM's return_token_ids: a choice's sampled ids. Streamed, vLLM sends each chunk's new ids;
    this server sends them all with the finishing chunk, which adds up to the same list."""
    return {"token_ids": result.token_ids} if body.return_token_ids else {}


def _sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    return header[7:] if header.lower().startswith("bearer ") else None


class EngineCollector:
    """Reads the engine's totals when Prometheus scrapes."""

    def __init__(self, engine: PolicyEngine):
        self.engine = engine

    def collect(self):
        tally = self.engine.tally
        yield CounterMetricFamily("gearshift_policy_generations", "Finished generations", value=tally.generations)
        yield CounterMetricFamily("gearshift_policy_prompt_tokens", "Prompt tokens read", value=tally.prompt_tokens)
        yield CounterMetricFamily("gearshift_policy_completion_tokens", "Tokens generated", value=tally.completion_tokens)
        yield CounterMetricFamily(
            "gearshift_policy_generation_seconds", "Seconds from accepting to finishing generations (queueing included)",
            value=tally.generation_seconds,
        )
        yield CounterMetricFamily("gearshift_policy_switches", "Checkpoint switches", value=tally.switches)
        yield GaugeMetricFamily("gearshift_policy_in_flight", "Generations running or queued", value=self.engine.in_flight)
        scheduler = self.engine.scheduler
        yield GaugeMetricFamily("gearshift_policy_running", "Generations in the running batch", value=scheduler.running)
        yield GaugeMetricFamily("gearshift_policy_waiting", "Generations waiting for a batch slot", value=scheduler.waiting)
        yield CounterMetricFamily("gearshift_policy_decode_steps", "Batched decode steps", value=scheduler.stats.steps)
        yield GaugeMetricFamily("gearshift_policy_threads", "OpenMP threads decode steps run on", value=scheduler.tuner.threads)
        yield CounterMetricFamily("gearshift_policy_draft_tokens", "Draft tokens checked (prompt lookup)", value=scheduler.stats.drafted)
        yield CounterMetricFamily(
            "gearshift_policy_draft_tokens_accepted", "Draft tokens the model agreed with", value=scheduler.stats.accepted
        )
        yield CounterMetricFamily("gearshift_policy_rejected", "Requests answered 429 (queue full)", value=scheduler.stats.rejected)
        prefixes = scheduler.prefix_cache
        yield CounterMetricFamily(
            "gearshift_policy_prefix_cache_hit_tokens", "Prompt tokens reused from the prefix cache", value=prefixes.stats.hit_tokens
        )
        yield GaugeMetricFamily("gearshift_policy_prefix_cache_bytes", "Bytes held by the prefix cache", value=prefixes.nbytes)


def create_app(engine: PolicyEngine) -> FastAPI:
    """The FastAPI application serving one engine."""
    app = FastAPI(title="gearshift policy server", docs_url=None, redoc_url=None)
    settings = engine.settings

    def require_key(request: Request) -> None:
        if settings.api_key and _bearer(request) != settings.api_key.get_secret_value():
            raise Unauthenticated("missing or wrong API key")

    def require_admin(request: Request) -> None:
        if settings.admin_token and _bearer(request) != settings.admin_token.get_secret_value():
            raise Unauthenticated("POST /v1/load needs the admin token")

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, _validation_message(exc))

    @app.exception_handler(GearshiftError)
    async def domain_error(request: Request, exc: GearshiftError) -> JSONResponse:
        status = next((code for kind, code in HTTP_STATUS.items() if isinstance(exc, kind)), 500)
        retry_after = getattr(exc, "retry_after_seconds", None)
        return error_response(status, str(exc), {"Retry-After": str(retry_after)} if retry_after is not None else None)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s", request.url.path)
        return error_response(500, "internal error")

    @app.get("/health")
    async def health() -> dict:
        current = engine.current
        return {"status": "ok", "model": engine.served_name, "source": current.source, "path": str(current.path)}

    @app.get("/v1/models", dependencies=[Depends(require_key)])
    async def models() -> dict:
        current = engine.current
        card = {
            "id": engine.served_name,
            "object": "model",
            "created": int(current.path.stat().st_mtime),
            "owned_by": "gearshift",
            "root": str(current.path),
            "max_model_len": current.context_length,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions", dependencies=[Depends(require_key)])
    async def completions(body: CompletionRequest, request: Request):
        generations = engine.submit(engine.completion_jobs(body))  # decoded together, in one batch
        meta = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()), "model": engine.served_name}
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return _stream(_completion_events(generations[0], meta, include_usage, body.return_token_ids))

        async def results_of_all() -> list[GenerationResult]:
            return list(await asyncio.gather(*(generation.result() for generation in generations)))

        results = await _unless_disconnected(request, results_of_all())
        choices = [
            {"index": i, "text": r.text, "finish_reason": r.finish_reason, "logprobs": None} | _token_ids(body, r)
            for i, r in enumerate(results)
        ]
        return {**meta, "choices": choices, "usage": _usage(results)}

    @app.post("/v1/chat/completions", dependencies=[Depends(require_key)])
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        job, parse_tools = engine.chat_job(body)
        generation = engine.submit([job])[0]  # a full queue answers 429 here, before any stream starts
        meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": engine.served_name}
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return _stream(_chat_events(generation, parse_tools, meta, include_usage, body.return_token_ids, raw=body.continue_final_message))
        result = await _unless_disconnected(request, generation.result())
        output = split_output(result.text, parse_tools, raw=body.continue_final_message)
        message = {"role": "assistant", "content": output.content, "reasoning_content": output.reasoning_content}
        if output.tool_calls:
            message["tool_calls"] = output.tool_calls
        finish = "tool_calls" if output.tool_calls else result.finish_reason
        choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None} | _token_ids(body, result)
        return {**meta, "object": "chat.completion", "choices": [choice], "usage": _usage([result])}

    registry = CollectorRegistry()
    registry.register(EngineCollector(engine))

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/load", dependencies=[Depends(require_admin)])
    async def load(body: LoadRequest) -> dict:
        return asdict(await engine.switch(body.model, body.served_model_name))

    return app


class ClientGone(Exception):
    """The client hung up before its reply was ready."""


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Awaits work, cancelling it (and so the generation) when the client hangs up: a caller
    that gave up must not keep the one generation thread busy."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_SECONDS)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        task.cancel()


def _stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _guarded(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """Once streaming has begun the status is sent: a failure becomes an error event."""
    try:
        async for event in events:
            yield event
    except GearshiftError as exc:
        yield _sse({"error": {"message": str(exc), "type": "server_error", "code": 500}})
    except Exception:
        log.exception("generation failed mid-stream")
        yield _sse({"error": {"message": "internal error", "type": "server_error", "code": 500}})
    yield _sse("[DONE]")


async def _completion_events(generation: Generation, meta: dict, include_usage: bool, token_ids: bool) -> AsyncIterator[str]:
    async def events() -> AsyncIterator[str]:
        async for item in generation.items():
            if isinstance(item, GenerationResult):
                ids = {"token_ids": item.token_ids} if token_ids else {}
                yield _sse({**meta, "choices": [{"index": 0, "text": "", "finish_reason": item.finish_reason} | ids]})
                if include_usage:
                    yield _sse({**meta, "choices": [], "usage": _usage([item])})
            else:
                yield _sse({**meta, "choices": [{"index": 0, "text": item, "finish_reason": None}]})

    async for event in _guarded(events()):
        yield event


def _delta(piece: Piece, call_index: int) -> dict:
    if piece.kind == "tool_call":
        return {"tool_calls": [{"index": call_index, **piece.call}]}
    return {"reasoning_content" if piece.kind == "reasoning" else "content": piece.text}


async def _chat_events(
    generation: Generation, parse_tools: bool, meta: dict, include_usage: bool, token_ids: bool, raw: bool = False
) -> AsyncIterator[str]:
    meta = {**meta, "object": "chat.completion.chunk"}

    def chunk(delta: dict, finish: str | None = None, ids: list[int] | None = None) -> str:
        extra = {"token_ids": ids} if ids is not None else {}
        return _sse({**meta, "choices": [{"index": 0, "delta": delta, "finish_reason": finish} | extra]})

    async def events() -> AsyncIterator[str]:
        splitter = OutputSplitter(parse_tools, parse_reasoning=not raw)
        calls = 0
        yield chunk({"role": "assistant", "content": ""})
        async for item in generation.items():
            final = isinstance(item, GenerationResult)
            for piece in splitter.finish() if final else splitter.feed(item):
                yield chunk(_delta(piece, calls))
                calls += piece.kind == "tool_call"
            if final:
                yield chunk({}, "tool_calls" if calls else item.finish_reason, item.token_ids if token_ids else None)
                if include_usage:
                    yield _sse({**meta, "choices": [], "usage": _usage([item])})

    async for event in _guarded(events()):
        yield event
