"""PolicyClient: the one way router, planner and executor reach the policy model, over any
OpenAI-compatible server (the built-in policy server, vLLM, SGLang).

Timeouts on every request; retries with exponential backoff on connection errors, 5xx and 429
(never on other 4xx: the same request would fail the same way); and domain errors when it gives
up, so callers handle Unavailable / InvalidArgument / DeadlineExceeded like any other service's.

    async with PolicyClient.from_settings(settings) as policy:
        done = await policy.complete("Q: 2+2?\\nA:", max_tokens=8, stop=["\\n"])
        print(done.text, done.finish_reason, done.usage.completion_tokens)
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

from gearshift.errors import DeadlineExceeded, GearshiftError, InvalidArgument, ResourceExhausted, Unauthenticated, Unavailable
from gearshift.settings import Settings, get_settings

RETRYABLE_STATUS = {429, 500, 502, 503, 504}
MAX_BACKOFF_SECONDS = 8.0


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    @classmethod
    def of(cls, body: dict | None) -> Usage:
        body = body or {}
        return cls(body.get("prompt_tokens", 0), body.get("completion_tokens", 0), body.get("total_tokens", 0))


@dataclass
class Completion:
    """A finished /v1/completions reply (first choice)."""

    text: str
    finish_reason: str | None
    usage: Usage


@dataclass
class ToolCall:
    """One call the model asked for; arguments decoded from the JSON string OpenAI sends."""

    id: str
    name: str
    arguments: dict
    raw_arguments: str

    @classmethod
    def of(cls, body: dict) -> ToolCall:
        function = body.get("function") or {}
        raw = function.get("arguments") or "{}"
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else dict(raw)
        except ValueError:
            arguments = {}  # kept verbatim in raw_arguments for the caller to explain
        return cls(body.get("id") or "", function.get("name") or "", arguments if isinstance(arguments, dict) else {}, str(raw))


@dataclass
class ChatCompletion:
    """A finished /v1/chat/completions reply (first choice)."""

    content: str | None
    reasoning_content: str | None
    tool_calls: list[ToolCall]
    finish_reason: str | None
    usage: Usage
    message: dict = field(default_factory=dict)  # the raw assistant message, to append to the history


@dataclass
class StreamChunk:
    """A piece of a streamed reply. The last chunk carries finish_reason and usage."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message"))
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return str(body)[:500]


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers.get("retry-after", ""))
    except ValueError:
        return None


class PolicyClient:
    """Async client of an OpenAI-compatible policy server; one per process, reused."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        retries: int = 3,
        backoff: float = 0.5,
        connect_timeout: float = 5.0,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.retries = retries
        self.backoff = backoff
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=httpx.Timeout(timeout, connect=connect_timeout)
        )

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> PolicyClient:
        settings = settings or get_settings()
        policy = settings.policy
        return cls(
            settings.policy_url,
            settings.policy_model,
            api_key=policy.api_key.get_secret_value() if policy.api_key else None,
            timeout=policy.client_timeout_seconds,
            retries=policy.client_retries,
            backoff=policy.client_backoff_seconds,
        )

    async def __aenter__(self) -> PolicyClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # Plumbing

    def _delay(self, attempt: int, response: httpx.Response | None = None) -> float:
        delay = min(self.backoff * 2**attempt, MAX_BACKOFF_SECONDS)
        hinted = _retry_after(response) if response is not None else None
        if hinted is not None:
            delay = min(max(delay, hinted), MAX_BACKOFF_SECONDS)
        return delay * (1 + 0.1 * random.random())  # a little jitter, so clients do not retry in step

    def _give_up(self, path: str, attempts: int, reason: str, status: int | None) -> GearshiftError:
        where = f"policy server {self.base_url}{path}"
        if status == 429:
            return ResourceExhausted(f"{where} is overloaded (429) after {attempts} attempt(s): {reason}")
        return Unavailable(f"{where} unavailable after {attempts} attempt(s): {reason}")

    @staticmethod
    def _client_error(response: httpx.Response) -> GearshiftError:
        message = f"policy server rejected the request ({response.status_code}): {_error_message(response)}"
        if response.status_code in (401, 403):
            return Unauthenticated(message)
        return InvalidArgument(message)

    async def _open(self, path: str, body: dict, stream: bool) -> httpx.Response:
        """Sends a POST with retries; returns a response with a 2xx status (open when streaming)."""
        reason, status = "", None
        for attempt in range(self.retries + 1):
            response = None
            try:
                request = self._http.build_request("POST", path, json=body)
                response = await self._http.send(request, stream=stream)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                reason, status = f"{type(exc).__name__}: {exc}", None
            except httpx.TimeoutException as exc:
                # The server took the request and is still working on it: retrying would double the work.
                raise DeadlineExceeded(f"policy server {self.base_url}{path} did not answer in time: {exc}") from None
            else:
                if response.status_code < 400:
                    return response
                if stream:
                    await response.aread()
                    await response.aclose()
                if response.status_code not in RETRYABLE_STATUS:
                    raise self._client_error(response)
                reason, status = f"{response.status_code}: {_error_message(response)}", response.status_code
            if attempt < self.retries:
                await asyncio.sleep(self._delay(attempt, response))
        raise self._give_up(path, self.retries + 1, reason, status)

    async def _post(self, path: str, body: dict) -> dict:
        response = await self._open(path, body, stream=False)
        try:
            return response.json()
        except ValueError:
            raise Unavailable(f"policy server {self.base_url}{path} sent a body that is not JSON") from None

    async def _events(self, path: str, body: dict) -> AsyncIterator[dict]:
        """The JSON events of a server-sent-event stream, up to [DONE]."""
        response = await self._open(path, body, stream=True)
        try:
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if "error" in event:
                    raise Unavailable(f"policy server failed mid-stream: {_error_message_of(event)}")
                yield event
        except httpx.TimeoutException as exc:
            raise DeadlineExceeded(f"policy server stream stalled: {exc}") from None
        except (httpx.TransportError, ValueError) as exc:
            raise Unavailable(f"policy server stream broke off: {type(exc).__name__}: {exc}") from None
        finally:
            await response.aclose()

    def _body(self, max_tokens: int, temperature: float, top_p: float, stop, seed, extra: dict) -> dict:
        body = {"model": self.model, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, **extra}
        if stop:
            body["stop"] = list(stop)
        if seed is not None:
            body["seed"] = seed
        return body

    # The API

    async def complete(
        self,
        prompt: str,
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: list[str] | None = None,
        seed: int | None = None,
        **extra,
    ) -> Completion:
        """Raw text completion; the text stops before the first stop word."""
        body = self._body(max_tokens, temperature, top_p, stop, seed, extra) | {"prompt": prompt}
        reply = await self._post("/completions", body)
        choice = (reply.get("choices") or [{}])[0]
        return Completion(choice.get("text") or "", choice.get("finish_reason"), Usage.of(reply.get("usage")))

    async def chat(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        tool_choice: str | dict | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: list[str] | None = None,
        seed: int | None = None,
        **extra,
    ) -> ChatCompletion:
        """Chat completion; tool calls and reasoning come back parsed by the server."""
        body = self._body(max_tokens, temperature, top_p, stop, seed, extra) | {"messages": messages}
        if tools:
            body["tools"] = tools
        if tool_choice is not None:
            body["tool_choice"] = tool_choice
        reply = await self._post("/chat/completions", body)
        choice = (reply.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        return ChatCompletion(
            content=message.get("content"),
            reasoning_content=message.get("reasoning_content") or message.get("reasoning"),
            tool_calls=[ToolCall.of(call) for call in message.get("tool_calls") or []],
            finish_reason=choice.get("finish_reason"),
            usage=Usage.of(reply.get("usage")),
            message=message,
        )

    async def stream(
        self,
        prompt: str,
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: list[str] | None = None,
        seed: int | None = None,
        **extra,
    ) -> AsyncIterator[StreamChunk]:
        """Streams a text completion; a last, text-free chunk has the finish reason and the usage.

        Retries happen only before the first chunk; breaking off the loop stops the generation.
        """
        body = self._body(max_tokens, temperature, top_p, stop, seed, extra)
        body |= {"prompt": prompt, "stream": True, "stream_options": {"include_usage": True}}
        finish, usage = None, None
        async for event in self._events("/completions", body):
            usage = Usage.of(event["usage"]) if event.get("usage") else usage
            for choice in event.get("choices") or []:
                finish = choice.get("finish_reason") or finish
                if choice.get("text"):
                    yield StreamChunk(text=choice["text"])
        yield StreamChunk(finish_reason=finish, usage=usage)

    async def stream_chat(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        tool_choice: str | dict | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: list[str] | None = None,
        seed: int | None = None,
        **extra,
    ) -> AsyncIterator[StreamChunk]:
        """Streams a chat completion: content and reasoning as they come; a last chunk has the
        assembled tool calls, the finish reason and the usage."""
        body = self._body(max_tokens, temperature, top_p, stop, seed, extra)
        body |= {"messages": messages, "stream": True, "stream_options": {"include_usage": True}}
        if tools:
            body["tools"] = tools
        if tool_choice is not None:
            body["tool_choice"] = tool_choice
        finish, usage = None, None
        pending: dict[int, dict] = {}  # vLLM sends a call's arguments in several deltas
        async for event in self._events("/chat/completions", body):
            usage = Usage.of(event["usage"]) if event.get("usage") else usage
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                finish = choice.get("finish_reason") or finish
                for call in delta.get("tool_calls") or []:
                    _merge_call(pending.setdefault(call.get("index", 0), {"function": {"arguments": ""}}), call)
                text, reasoning = delta.get("content") or "", delta.get("reasoning_content") or delta.get("reasoning") or ""
                if text or reasoning:
                    yield StreamChunk(text=text, reasoning=reasoning)
        calls = [ToolCall.of(call) for _, call in sorted(pending.items())]
        yield StreamChunk(tool_calls=calls, finish_reason=finish, usage=usage)

    async def models(self) -> list[str]:
        """The model names the server serves."""
        try:
            response = await self._http.get("/models")
        except httpx.TransportError as exc:
            raise Unavailable(f"policy server {self.base_url} unreachable: {exc}") from None
        if response.status_code >= 400:
            raise self._client_error(response)
        return [card["id"] for card in response.json().get("data", [])]

    async def load(self, model: str, served_model_name: str | None = None, admin_token: str | None = None) -> dict:
        """Asks the built-in server to switch checkpoints (POST /v1/load); returns its report."""
        body = {"model": model} | ({"served_model_name": served_model_name} if served_model_name else {})
        headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else None
        try:
            response = await self._http.post("/load", json=body, headers=headers)
        except httpx.TransportError as exc:
            raise Unavailable(f"policy server {self.base_url} unreachable: {exc}") from None
        if response.status_code >= 400:
            raise self._client_error(response)
        return response.json()


def _error_message_of(event: dict) -> str:
    error = event.get("error")
    return str(error.get("message")) if isinstance(error, dict) else str(error)


def _merge_call(target: dict, delta: dict) -> None:
    """Folds one streamed tool-call delta into the call being assembled."""
    if delta.get("id"):
        target["id"] = delta["id"]
    function = delta.get("function") or {}
    if function.get("name"):
        target["function"]["name"] = function["name"]
    target["function"]["arguments"] += function.get("arguments") or ""
