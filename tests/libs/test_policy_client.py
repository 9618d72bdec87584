"""PolicyClient against real local HTTP servers that misbehave on purpose: retries with
backoff on connection errors, 5xx and 429, none on other 4xx, domain errors when it gives up."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest
import uvicorn
from gearshift.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted, Unauthenticated, Unavailable
from gearshift.policy_client import PolicyClient
from gearshift.settings import PolicyClientSettings, Settings
from gearshift.testing.ports import free_port
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

COMPLETION = {
    "choices": [{"index": 0, "text": " Paris", "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9},
}


class Script:
    """Answers the first len(failures) requests with those responses, then with then()."""

    def __init__(self, failures: list, then):
        self.failures, self.then, self.seen = list(failures), then, []

    async def __call__(self, request: Request) -> Response:
        self.seen.append(await request.json())
        if len(self.seen) <= len(self.failures):
            return self.failures[len(self.seen) - 1]
        return self.then()



@contextlib.asynccontextmanager
async def serving(handler, port: int | None = None, delay: float = 0.0):
    """A real uvicorn server on loopback answering every POST with handler (after `delay` s)."""
    async def endpoint(request: Request) -> Response:
        return await handler(request)

    app = Starlette(routes=[Route("/v1/{path:path}", endpoint, methods=["POST"])])
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off"))
    server.install_signal_handlers = lambda: None

    async def start_later():
        await asyncio.sleep(delay)
        await server.serve()

    task = asyncio.create_task(start_later())
    try:
        if not delay:
            while not server.started:
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        await task


def client(url: str, **options) -> PolicyClient:
    return PolicyClient(url, "smollm2", **({"retries": 3, "backoff": 0.05, "timeout": 5.0} | options))


def error(status: int, message: str = "boom", **headers) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status}}, status, headers=headers)


async def test_5xx_is_retried_with_growing_delays_until_it_succeeds():
    script = Script([error(503), error(502)], lambda: JSONResponse(COMPLETION))
    async with serving(script) as url, client(url) as policy:
        started = time.perf_counter()
        done = await policy.complete("Capital of France?", max_tokens=4, stop=["\n"])
        elapsed = time.perf_counter() - started
    assert (done.text, done.finish_reason, done.usage.total_tokens) == (" Paris", "stop", 9)
    assert len(script.seen) == 3 and elapsed >= 0.05 + 0.10
    assert script.seen[0] == {"model": "smollm2", "max_tokens": 4, "temperature": 0.0, "top_p": 1.0, "prompt": "Capital of France?", "stop": ["\n"]}


async def test_429_waits_as_long_as_retry_after_says():
    script = Script([error(429, "busy", **{"retry-after": "0.3"})], lambda: JSONResponse(COMPLETION))
    async with serving(script) as url, client(url) as policy:
        started = time.perf_counter()
        await policy.complete("hi")
        assert time.perf_counter() - started >= 0.3
    assert len(script.seen) == 2


@pytest.mark.parametrize(("status", "raised"), [(500, Unavailable), (503, Unavailable), (429, ResourceExhausted)])
async def test_gives_up_after_the_retries_with_a_domain_error(status, raised):
    script = Script([], lambda: error(status, "still down"))
    async with serving(script) as url, client(url, retries=2) as policy:
        with pytest.raises(raised, match="after 3 attempt") as caught:
            await policy.complete("hi")
    assert len(script.seen) == 3 and "still down" in str(caught.value)


@pytest.mark.parametrize(("status", "raised"), [(400, InvalidArgument), (404, InvalidArgument), (422, InvalidArgument), (401, Unauthenticated)])
async def test_other_4xx_fail_at_once_with_the_servers_message(status, raised):
    script = Script([], lambda: error(status, "max_tokens must be between 1 and 4096"))
    async with serving(script) as url, client(url) as policy:
        with pytest.raises(raised, match="max_tokens must be between"):
            await policy.complete("hi", max_tokens=0)
    assert len(script.seen) == 1


async def test_nobody_listening_is_unavailable_after_backing_off():
    async with client(f"http://127.0.0.1:{free_port()}/v1", retries=2) as policy:
        started = time.perf_counter()
        with pytest.raises(Unavailable, match="Cannot connect"):
            await policy.complete("hi")
        assert time.perf_counter() - started >= 0.05 + 0.10


async def test_a_server_that_comes_up_late_is_reached_by_retrying():
    port = free_port()
    script = Script([], lambda: JSONResponse(COMPLETION))
    async with serving(script, port=port, delay=0.3) as url, client(url, retries=6, backoff=0.1) as policy:
        assert (await policy.complete("hi")).text == " Paris"
    assert len(script.seen) == 1


async def test_a_slow_answer_is_deadline_exceeded_and_not_repeated():
    async def slow(request: Request) -> Response:
        slow.calls += 1
        await asyncio.sleep(1.0)
        return JSONResponse(COMPLETION)

    slow.calls = 0
    async with serving(slow) as url, client(url, timeout=0.2) as policy:
        with pytest.raises(DeadlineExceeded):
            await policy.complete("hi")
    assert slow.calls == 1


def sse(*events) -> StreamingResponse:
    async def body():
        for event in events:
            yield f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


def delta(**fields) -> dict:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


async def test_chat_stream_assembles_tool_calls_sent_in_pieces_like_vllm():
    stream = sse(
        delta(role="assistant", content=""),
        delta(reasoning_content="need "),
        delta(reasoning_content="code"),
        delta(content="Let me run it."),
        delta(tool_calls=[{"index": 0, "id": "call_a", "type": "function", "function": {"name": "python", "arguments": ""}}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '{"code": "print('}}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '17*23)"}'}}]),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}},
        "[DONE]",
    )
    script = Script([error(503)], lambda: stream)
    async with serving(script) as url, client(url) as policy:
        chunks = [c async for c in policy.stream_chat([{"role": "user", "content": "17*23?"}], tools=[{"type": "function", "function": {"name": "python"}}])]
    assert "".join(c.reasoning for c in chunks) == "need code"
    assert "".join(c.text for c in chunks) == "Let me run it."
    last = chunks[-1]
    assert (last.finish_reason, last.usage.completion_tokens) == ("tool_calls", 12)
    assert [(t.id, t.name, t.arguments) for t in last.tool_calls] == [("call_a", "python", {"code": "print(17*23)"})]
    assert script.seen[1]["stream"] is True and script.seen[1]["stream_options"] == {"include_usage": True}


async def test_an_error_event_mid_stream_is_unavailable():
    script = Script([], lambda: sse({"choices": [{"index": 0, "text": "Par", "finish_reason": None}]}, {"error": {"message": "out of memory"}}, "[DONE]"))
    async with serving(script) as url, client(url) as policy:
        seen = []
        with pytest.raises(Unavailable, match="out of memory"):
            async for chunk in policy.stream("hi"):
                seen.append(chunk.text)
    assert seen == ["Par"]


def test_from_settings_uses_the_policy_client_section():
    settings = Settings(policy_client=PolicyClientSettings(url="http://10.0.0.5:8000/v1/", model="agents-a1", retries=7))
    policy = PolicyClient.from_settings(settings)
    assert (policy.base_url, policy.model, policy.retries) == ("http://10.0.0.5:8000/v1", "agents-a1", 7)
