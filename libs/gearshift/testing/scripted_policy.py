"""ScriptedPolicy: an OpenAI-compatible HTTP server whose "model" is a Python function.

It is a stand-in, named as such: it isolates the executor's own logic and overhead from model
time (deterministic tool calls in tests, zero-latency turns in benchmarks). End-to-end tests
use the real policy server with the real model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Callable

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

Responder = Callable[[dict], str]  # request body -> the text the "model" writes


def _cut(text: str, stop: list[str]) -> tuple[str, str]:
    """Applies stop words as an OpenAI server does: the text ends before the first one."""
    hits = [text.find(word) for word in stop if word and word in text]
    if hits:
        return text[: min(hits)], "stop"
    return text, "stop"


def _usage(body: dict, text: str) -> dict:
    prompt = body.get("prompt") or json.dumps(body.get("messages", []))
    usage = {"prompt_tokens": max(1, len(str(prompt)) // 4), "completion_tokens": max(1, len(text) // 4)}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return usage


def create_app(respond: Responder, model: str = "scripted") -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model, "object": "model"}]}

    async def reply(request: Request, chat: bool):
        body = await request.json()
        stop = body.get("stop") or []
        text, finish = _cut(respond(body), [stop] if isinstance(stop, str) else stop)
        usage = _usage(body, text)
        if not body.get("stream"):
            choice = {"index": 0, "finish_reason": finish}
            choice |= {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            return JSONResponse({"id": "scripted", "object": "chat.completion", "model": model, "choices": [choice], "usage": usage})

        async def events() -> AsyncIterator[str]:
            piece = {"delta": {"content": text}} if chat else {"text": text}
            yield f"data: {json.dumps({'choices': [{'index': 0, **piece, 'finish_reason': None}]})}\n\n"
            done = {"delta": {}} if chat else {"text": ""}
            yield f"data: {json.dumps({'choices': [{'index': 0, **done, 'finish_reason': finish}]})}\n\n"
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await reply(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await reply(request, chat=False)

    return app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.asynccontextmanager
async def serve_scripted(respond: Responder, model: str = "scripted") -> AsyncIterator[str]:
    """Serves a ScriptedPolicy on a free loopback port; yields its base URL (…/v1)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(respond, model), host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    deadline = time.monotonic() + 10
    while not server.started:
        if task.done() or time.monotonic() > deadline:
            raise RuntimeError("scripted policy server did not start")
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        await task
