"""The HTTP face of the policy engine: OpenAI-compatible routes and server-sent events. Errors,
events and the reading of bodies are gearshift.openai_http's, as the gateway's are."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from gearshift import openai_http
from gearshift.errors import Unauthenticated
from gearshift.http_server import unless_disconnected
from gearshift.openai_http import sse
from gearshift.protocol.parsers import Piece
from gearshift.services.policy_server import logprobs
from gearshift.services.policy_server.core import ChatJobs, Generation, PolicyEngine
from gearshift.services.policy_server.generation import Delta, GenerationResult, TokenLogprob
from gearshift.services.policy_server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    LoadRequest,
    SamplingFields,
    TokenizeRequest,
)
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger("gearshift.policy_server.http")

RESPONSES_API = "/v1/responses"
ROUTES = "/v1/chat/completions, /v1/completions, /v1/models, /tokenize, /detokenize, /v1/load, /health and /metrics"


def _route_missing(request: Request, status: int) -> str:
    """The message of an unknown route or method: what this server serves instead."""
    where = f"{request.method} {request.url.path}"
    if request.url.path.rstrip("/") == RESPONSES_API:
        return "the Responses API (/v1/responses) is not served by the built-in policy server: use /v1/chat/completions"
    if status == 405:
        return f"{where}: method not allowed"
    return f"{where} is not a route of the built-in policy server; it serves {ROUTES}"


def _usage(results: list[GenerationResult], n: int = 1) -> dict:
    """Usage of a request's choices: each prompt's tokens once (its n choices share it, as
    OpenAI and vLLM count), every choice's completion tokens."""
    prompt = sum(r.prompt_tokens for r in results[::n])
    completion = sum(r.completion_tokens for r in results)
    cached = sum(r.cached_tokens for r in results[::n])  # as OpenAI and vLLM report prefix-cache hits
    return {
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _token_ids(body: SamplingFields, result: GenerationResult) -> dict:
    """vLLM's return_token_ids: a choice's sampled ids. Streamed, vLLM sends each chunk's new ids;
    this server sends them all with the finishing chunk, which adds up to the same list."""
    return {"token_ids": result.token_ids} if body.return_token_ids else {}


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
    openai_http.install(app, log, _route_missing)
    settings = engine.settings

    def require_key(request: Request) -> None:
        if settings.api_key and _bearer(request) != settings.api_key.get_secret_value():
            raise Unauthenticated("missing or wrong API key")

    def require_admin(request: Request) -> None:
        if settings.admin_token and _bearer(request) != settings.admin_token.get_secret_value():
            raise Unauthenticated("POST /v1/load needs the admin token")

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
        jobs = engine.completion_jobs(body)
        generations = engine.submit(jobs)  # decoded together, in one batch
        tokenizer = jobs[0].loaded.tokenizer
        meta = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()), "model": engine.served_name}
        if body.stream:
            return _stream(_completion_events(generations, tokenizer, meta, body))
        results = await unless_disconnected(request, _all_results(generations))
        choices = [
            {"index": i, "text": r.text, "finish_reason": r.finish_reason, "logprobs": _completion_logprobs(tokenizer, r.logprobs)}
            | _token_ids(body, r)
            for i, r in enumerate(results)
        ]
        return {**meta, "choices": choices, "usage": _usage(results, body.n)}

    @app.post("/v1/chat/completions", dependencies=[Depends(require_key)])
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        chat = engine.chat_jobs(body)
        generations = engine.submit(chat.jobs)  # a full queue answers 429 here, before any stream starts
        tokenizer = chat.jobs[0].loaded.tokenizer
        meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": engine.served_name}
        if body.stream:
            return _stream(_chat_events(generations, chat, tokenizer, meta, body))
        results = await unless_disconnected(request, _all_results(generations))
        choices = [_chat_choice(i, result, chat, tokenizer, body) for i, result in enumerate(results)]
        return {**meta, "object": "chat.completion", "choices": choices, "usage": _usage(results, body.n)}

    @app.post("/tokenize", dependencies=[Depends(require_key)])
    async def tokenize(body: TokenizeRequest) -> dict:
        ids = engine.tokenize(body)
        strings = engine.current.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": engine.current.context_length, "tokens": ids, "token_strs": strings}

    @app.post("/detokenize", dependencies=[Depends(require_key)])
    async def detokenize(body: DetokenizeRequest) -> dict:
        return {"prompt": engine.detokenize(body)}

    registry = CollectorRegistry()
    registry.register(EngineCollector(engine))

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/load", dependencies=[Depends(require_admin)])
    async def load(body: LoadRequest) -> dict:
        return asdict(await engine.switch(body.model, body.served_model_name))

    return app


def _stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _all_results(generations: list[Generation]) -> list[GenerationResult]:
    return list(await asyncio.gather(*(generation.result() for generation in generations)))


def _completion_logprobs(tokenizer, entries: list[TokenLogprob] | None, offset: int = 0) -> dict | None:
    return None if entries is None else logprobs.completion_logprobs(tokenizer, entries, offset)


def _chat_logprobs(tokenizer, entries: list[TokenLogprob] | None) -> dict | None:
    return None if entries is None else {"content": logprobs.chat_content(tokenizer, entries), "refusal": None}


def _chat_choice(index: int, result: GenerationResult, chat: ChatJobs, tokenizer, body: ChatCompletionRequest) -> dict:
    output = chat.reply.split(result.text)
    message = {"role": "assistant", "content": output.content, "reasoning_content": output.reasoning}
    calls = output.tool_calls[: chat.max_tool_calls]
    if calls:
        message["tool_calls"] = calls
    finish = "tool_calls" if calls else result.finish_reason
    choice = {"index": index, "message": message, "finish_reason": finish, "logprobs": _chat_logprobs(tokenizer, result.logprobs)}
    return choice | _token_ids(body, result)


async def _next(stream: AsyncIterator):
    return await anext(stream)


async def _merged(generations: list[Generation]) -> AsyncIterator[tuple[int, Delta | GenerationResult]]:
    """The items of a request's generations as they come, each with its choice index; leaving
    early (a client gone) cancels every generation still running."""
    streams = [generation.items() for generation in generations]
    waiting = {asyncio.ensure_future(_next(stream)): index for index, stream in enumerate(streams)}
    try:
        while waiting:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=waiting.__getitem__):
                index = waiting.pop(task)
                try:
                    item = task.result()
                except StopAsyncIteration:
                    continue
                yield index, item
                waiting[asyncio.ensure_future(_next(streams[index]))] = index
    finally:
        for task in waiting:
            task.cancel()
        for generation in generations:
            generation.cancel()


@dataclass
class _LogprobsOut:
    """One streamed choice's log-probabilities: those that arrived and are not sent yet."""

    pending: list[TokenLogprob] = field(default_factory=list)
    arrived: int = 0
    offset: int = 0  # completions' text_offset of the next token

    def add(self, entries: list[TokenLogprob] | None) -> None:
        if entries:
            self.pending += entries
            self.arrived += len(entries)

    def finish(self, result: GenerationResult) -> None:
        """Whatever the result has beyond the deltas (tokens whose text never became a delta)."""
        self.add((result.logprobs or [])[self.arrived :])

    def take(self) -> list[TokenLogprob]:
        taken, self.pending = self.pending, []
        return taken


async def _completion_events(generations: list[Generation], tokenizer, meta: dict, body: CompletionRequest) -> AsyncIterator[str]:
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    out = [_LogprobsOut() for _ in generations]  # chunks carry the entries that arrived with their text

    def chunk(index: int, text: str, finish: str | None = None, extra: dict | None = None) -> str:
        entries = out[index].take()
        shaped = logprobs.completion_logprobs(tokenizer, entries, out[index].offset) if entries else None
        if shaped:
            out[index].offset += sum(len(token) for token in shaped["tokens"])
        choice = {"index": index, "text": text, "logprobs": shaped, "finish_reason": finish} | (extra or {})
        return sse({**meta, "choices": [choice]})

    async def events() -> AsyncIterator[str]:
        results: list[GenerationResult | None] = [None] * len(generations)
        async for index, item in _merged(generations):
            if isinstance(item, GenerationResult):
                results[index] = item
                out[index].finish(item)
                yield chunk(index, "", item.finish_reason, _token_ids(body, item))
            else:
                out[index].add(item.logprobs)
                yield chunk(index, item.text)
        if include_usage:
            yield sse({**meta, "choices": [], "usage": _usage(results, body.n)})

    async for event in openai_http.ending_with_done(events(), log):
        yield event


def _delta(piece: Piece, call_index: int) -> dict:
    if piece.kind == "tool_call":
        return {"tool_calls": [{"index": call_index, **piece.call}]}
    return {"reasoning_content" if piece.kind == "reasoning" else "content": piece.text}


async def _chat_events(
    generations: list[Generation], chat: ChatJobs, tokenizer, meta: dict, body: ChatCompletionRequest
) -> AsyncIterator[str]:
    meta = {**meta, "object": "chat.completion.chunk"}
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    splitters = [chat.reply.splitter() for _ in generations]
    calls = [0] * len(generations)
    out = [_LogprobsOut() for _ in generations]

    def chunk(index: int, delta: dict, finish: str | None = None, extra: dict | None = None) -> str:
        entries = out[index].take()
        shaped = _chat_logprobs(tokenizer, entries) if entries else None
        choice = {"index": index, "delta": delta, "logprobs": shaped, "finish_reason": finish} | (extra or {})
        return sse({**meta, "choices": [choice]})

    def pieces(index: int, found: list[Piece]) -> list[str]:
        chunks = []
        for piece in found:
            call_index = calls[index]
            if piece.kind == "tool_call":
                if chat.max_tool_calls is not None and call_index >= chat.max_tool_calls:
                    continue  # parallel_tool_calls false: the first call only
                calls[index] += 1
            chunks.append(chunk(index, _delta(piece, call_index)))
        return chunks

    async def events() -> AsyncIterator[str]:
        results: list[GenerationResult | None] = [None] * len(generations)
        for index in range(len(generations)):
            yield chunk(index, {"role": "assistant", "content": ""})
        async for index, item in _merged(generations):
            if isinstance(item, GenerationResult):
                results[index] = item
                out[index].finish(item)
                for event in pieces(index, splitters[index].finish()):
                    yield event
                finish = "tool_calls" if calls[index] else item.finish_reason
                yield chunk(index, {}, finish, _token_ids(body, item))
            else:
                out[index].add(item.logprobs)
                for event in pieces(index, splitters[index].feed(item.text)):
                    yield event
        if include_usage:
            yield sse({**meta, "choices": [], "usage": _usage(results, body.n)})

    async for event in openai_http.ending_with_done(events(), log):
        yield event
