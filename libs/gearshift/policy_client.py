"""PolicyClient: the one way router, planner and executor reach the policy model, over any
OpenAI-compatible server (the built-in policy server, vLLM, SGLang).

Timeouts on every request, never past the deadline of the work in hand (the incoming call's, an
episode's budget: gearshift.deadlines); retries with exponential backoff on connection errors,
5xx and 429 (never on other 4xx: the same request would fail the same way), within a retry
budget per client (RetryBudget, gRPC's retry throttling: a server that is down gets about one
request per call, not 1 + retries); and domain errors when it gives up, so callers handle
Unavailable / InvalidArgument / DeadlineExceeded like any other service's. The policy servers it
speaks to (the built-in one, vLLM, SGLang) call no dependency of their own, so each of their 5xx
is theirs, and one the budget allows is worth retrying.

The model name a client asks for may be an alias of versioned names, `<alias>@<version>` (a
training run serves each step's LoRA adapter under a new name): when the server no longer serves
the name in use, the client moves to the alias's newest version and asks again.

New weights reach a running server by the route its engine has (PolicyClient.engine, asked once):
the built-in server switches checkpoints (POST /v1/load); vLLM serves LoRA adapters at run time
(/v1/load_lora_adapter, /v1/unload_lora_adapter) and reloads full weights in place
(/collective_rpc reload_weights, then /reset_prefix_cache). vLLM's other candidates do not work in
its CPU build 0.32.0: /sleep and /wake_up are no-ops there, and the weight-transfer engines
(/init_weight_transfer_engine, /update_weights) are NCCL or CUDA IPC: on GPUs,
gearshift.training.weight_transfer streams full weights into the NCCL one (vllm_admin).

    async with PolicyClient.from_settings(settings) as policy:
        done = await policy.complete("Q: 2+2?\\nA:", max_tokens=8, stop=["\\n"])
        print(done.text, done.finish_reason, done.usage.completion_tokens)
"""

from __future__ import annotations

import asyncio
import json
import random
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp

from gearshift.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    GearshiftError,
    InvalidArgument,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from gearshift import deadlines, logs, tls, tracing, vllm_plugins
from gearshift.api.common.v1.common_pb2 import TokenUsage
from gearshift.settings import Settings, get_settings

RETRYABLE_STATUS = {429, 500, 502, 503, 504}
MAX_BACKOFF_SECONDS = 8.0

# The engines a server can run, told apart by the owned_by of its /v1/models entries.
BUILTIN, VLLM, OTHER = "gearshift", "vllm", "other"
ENGINE_NAMES = {BUILTIN: "the built-in policy server", VLLM: "vLLM", OTHER: "an OpenAI-compatible server of unknown kind"}
VERSION_MARK = "@"


def versioned(alias: str, version: int) -> str:
    """The served name of an alias's version (a training step's adapter)."""
    return f"{alias}{VERSION_MARK}{version}"


def newest_version(alias: str, names: list[str]) -> str | None:
    """The alias's newest versioned name among names, or None when it has none."""
    prefix = alias + VERSION_MARK
    versions = [(int(name[len(prefix):]), name) for name in names if name.startswith(prefix) and name[len(prefix):].isdigit()]
    return max(versions)[1] if versions else None


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the engine served from its prefix cache

    @classmethod
    def of(cls, body: dict | None) -> Usage:
        body = body or {}
        cached = (body.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return cls(body.get("prompt_tokens", 0), body.get("completion_tokens", 0), body.get("total_tokens", 0), cached)

    def tokens(self) -> TokenUsage:
        """The call's usage as the trajectory records it."""
        return TokenUsage(input_tokens=self.prompt_tokens, output_tokens=self.completion_tokens, cached_input_tokens=self.cached_tokens)

    def span_attributes(self) -> dict:
        """The usage as OpenTelemetry's GenAI attributes (prompt and completion tokens)."""
        return {"gen_ai.usage.input_tokens": self.prompt_tokens, "gen_ai.usage.output_tokens": self.completion_tokens,
                "gearshift.usage.cached_input_tokens": self.cached_tokens}


@dataclass
class Completion:
    """A finished /v1/completions reply (first choice)."""

    text: str
    finish_reason: str | None
    usage: Usage
    token_ids: list[int] | None = None  # the sampled ids, where the server returns them
    logprobs: list[float] | None = None  # each sampled id's log-probability, where the server returns them


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
    token_ids: list[int] | None = None  # the sampled ids, where the server returns them
    logprobs: list[float] | None = None  # each sampled id's log-probability, where the server returns them


@dataclass
class StreamChunk:
    """A piece of a streamed reply. The last chunk carries finish_reason, usage and all the
    sampled token ids (where the server returns them)."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None  # one per token_ids entry, where the server returned them all


def _error_message(text: str, reason: str) -> str:
    try:
        body = json.loads(text)
    except ValueError:
        return text[:500] or reason
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message"))
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return str(body)[:500]


def _retry_after(response: aiohttp.ClientResponse) -> float | None:
    try:
        return float(response.headers.get("retry-after", ""))
    except ValueError:
        return None


# A read that times out means the server took the request and is still working on it: retrying
# would double the work. A connection that fails or drops is safe to retry.
READ_TIMEOUTS = (aiohttp.SocketTimeoutError, asyncio.TimeoutError)


class RetryBudget:
    """A token bucket bounding one client's retries, as gRPC's retryThrottling does a channel's
    (gRFC A6): every failed attempt takes a token, every success gives back token_ratio, and a
    retry is made only while more than half of max_tokens are left. While requests succeed a
    failure is retried as before; once a run of failures has spent the budget, each request is
    tried once, until successes earn it back."""

    def __init__(self, max_tokens: float = 10, token_ratio: float = 0.1):
        self.max_tokens = float(max_tokens)
        self.token_ratio = token_ratio
        self.tokens = float(max_tokens)

    def succeeded(self) -> None:
        self.tokens = min(self.max_tokens, self.tokens + self.token_ratio)

    def failed(self) -> bool:
        """Records a failed attempt; True when a retry is allowed."""
        self.tokens = max(0.0, self.tokens - 1)
        return self.tokens > self.max_tokens / 2


class _ModelNotServed(InvalidArgument):
    """The server answered 404 to a request naming a model (vLLM: that name is not served)."""


class _RouteMissing(InvalidArgument):
    """The server has no such route (a plain 404 Not Found): a feature it was started without."""


# What vLLM answers when it was started without what an admin call needs, and the fix to name.
VLLM_REFUSALS = {
    "LoRA is not enabled": "vLLM refused the LoRA adapter: start it with --enable-lora",
    "greater than max_lora_rank": "vLLM refused the LoRA adapter: start it with a --max-lora-rank of at least the run's lora_rank",
}


class PolicyClient:
    """Async client of an OpenAI-compatible policy server; one per process, reused.

    aiohttp rather than httpx: on this hot path (every policy turn) it costs about a tenth as
    much per streamed request (benchmarks/executor_overhead.py)."""

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
        token_ids: bool = False,
        logprobs: bool = False,
        chat_template: str | None = None,
        tls_context: ssl.SSLContext | None = None,
        server_name: str = "",
        retry_budget: RetryBudget | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model  # what the settings name: a served model, or an alias of versioned names
        self.served_model = model  # the name requests carry now
        self._engine: str | None = None
        self.retries = retries
        self.backoff = backoff
        self.retry_budget = retry_budget or RetryBudget()
        self._connect_timeout, self._read_timeout = connect_timeout, timeout
        self._token_ids = {"return_token_ids": True} if token_ids else {}
        self._logprobs = logprobs  # ask for each sampled token's log-probability (the behaviour policy's)
        self.chat_template = chat_template  # the native protocol's requests carry it (None: the server's)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=timeout)
        self._http: aiohttp.ClientSession | None = None  # made on first use, inside the running loop
        self._admin: aiohttp.ClientSession | None = None  # admin calls: a new connection each
        self._tls = tls_context  # None: the system's CAs (an https URL) or plaintext
        self._server_name = {"server_hostname": server_name} if server_name else {}  # checked in the certificate, not the host dialed

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> PolicyClient:
        settings = settings or get_settings()
        client = settings.policy_client
        return cls(
            client.url,
            client.model,
            api_key=client.api_key.get_secret_value() if client.api_key else None,
            timeout=client.timeout_seconds,
            retries=client.retries,
            backoff=client.backoff_seconds,
            token_ids=client.return_token_ids,
            logprobs=client.return_logprobs,
            chat_template=vllm_plugins.chat_template_text(client.chat_template),
            tls_context=tls.client_context(settings.tls),
            server_name=settings.tls.server_name if settings.tls.enabled else "",
            retry_budget=RetryBudget(settings.rpc.retry_max_tokens, settings.rpc.retry_token_ratio),
        )

    async def __aenter__(self) -> PolicyClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for session in (self._http, self._admin):
            if session is not None:
                await session.close()

    # Plumbing

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            connector = aiohttp.TCPConnector(ssl=self._tls or True)
            self._http = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout, connector=connector)
        return self._http

    def _admin_session(self) -> aiohttp.ClientSession:
        # Admin calls come minutes apart (a weight sync after each training step), by when the
        # server has closed a pooled connection after its keep-alive timeout, and a POST sent on it
        # in the moment before the client notices fails. A new connection costs under a millisecond.
        if self._admin is None or self._admin.closed:
            connector = aiohttp.TCPConnector(force_close=True, ssl=self._tls or True)
            self._admin = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout, connector=connector)
        return self._admin

    def _delay(self, attempt: int, response: aiohttp.ClientResponse | None = None) -> float:
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
    async def _client_error(response: aiohttp.ClientResponse, names_model: bool = False) -> GearshiftError:
        text = await response.text(errors="replace")
        response.release()
        reason = _error_message(text, response.reason or "")
        message = f"policy server rejected the request ({response.status}): {reason}"
        if response.status in (401, 403):
            return Unauthenticated(message)
        if response.status == 404 and reason == "Not Found":
            return _RouteMissing(message)
        if response.status == 404 and names_model:
            return _ModelNotServed(message)
        return InvalidArgument(message)

    def _url(self, path: str, root: bool) -> str:
        """base_url + path; root: the server's own routes, beside /v1 (vLLM's admin routes)."""
        return (self.base_url.removesuffix("/v1") if root else self.base_url) + path

    async def _request(self, method: str, path: str, root: bool = False, admin: bool = False, **kwargs) -> aiohttp.ClientResponse:
        session = self._admin_session() if admin else self._session()
        # The ids and trace context go along (the built-in server and vLLM continue the trace); a
        # traced call's own headers (its span's traceparent) win over the current span's.
        kwargs["headers"] = logs.id_headers() | tracing.trace_headers() | (kwargs.get("headers") or {})
        left = deadlines.remaining()
        if left is not None:  # the whole request, its streamed body included, ends by the deadline in hand
            if left <= 0:
                raise DeadlineExceeded(f"no time left for a request to policy server {self._url(path, root)}: the caller's deadline has passed")
            kwargs["timeout"] = aiohttp.ClientTimeout(total=left, sock_connect=min(self._connect_timeout, left),
                                                      sock_read=min(self._read_timeout, left))
        try:
            return await session.request(method, self._url(path, root), **self._server_name, **kwargs)
        except READ_TIMEOUTS as exc:
            raise DeadlineExceeded(f"policy server {self._url(path, root)} did not answer in time: {exc!r}") from None

    async def _open(self, path: str, body: dict, root: bool = False, headers: dict | None = None) -> aiohttp.ClientResponse:
        """Sends a POST with retries; returns a response with a 2xx status, body unread. A model
        the server stopped serving is followed to its alias's newest version, once."""
        try:
            return await self._send(path, body, root, headers)
        except _ModelNotServed:
            if "model" not in body or not await self._follow_alias(body["model"]):
                raise
            return await self._send(path, body | {"model": self.served_model}, root, headers)

    async def _follow_alias(self, used: str) -> bool:
        """Moves served_model to the newest version of the alias self.model names; False when
        there is none other than used, the name the refused request carried (requests refused at
        once all follow: the first to ask moves served_model, the others find it moved)."""
        try:
            newest = newest_version(self.model, await self.models())
        except GearshiftError:
            return False
        if newest is None or newest == used:
            return False
        self.served_model = newest
        return True

    async def _send(self, path: str, body: dict, root: bool = False, headers: dict | None = None) -> aiohttp.ClientResponse:
        reason, status = "", None
        for attempt in range(self.retries + 1):
            response = None
            try:
                response = await self._request("POST", path, root, json=body, headers=headers)
            except aiohttp.ClientConnectionError as exc:  # refused, reset, dropped, connect timeout
                reason, status = f"{type(exc).__name__}: {exc}", None
            else:
                if response.status < 400:
                    self.retry_budget.succeeded()
                    return response
                if response.status not in RETRYABLE_STATUS:
                    raise await self._client_error(response, names_model="model" in body)
                text = await response.text(errors="replace")
                response.release()
                reason, status = f"{response.status}: {_error_message(text, response.reason or '')}", response.status
            allowed = self.retry_budget.failed()  # every failed attempt counts, the last one too
            if attempt == self.retries:
                break
            if not allowed:
                reason += " (no retry: the client's retry budget is spent)"
                break
            delay, left = self._delay(attempt, response), deadlines.remaining()
            if left is not None and left <= delay:  # a retry could not finish in time
                break
            await asyncio.sleep(delay)
        raise self._give_up(path, attempt + 1, reason, status)

    async def _json(self, response: aiohttp.ClientResponse, path: str) -> dict:
        try:
            return await response.json(content_type=None)
        except READ_TIMEOUTS as exc:
            raise DeadlineExceeded(f"policy server {self.base_url}{path} stalled mid-reply: {exc!r}") from None
        except (ValueError, aiohttp.ClientError):
            raise Unavailable(f"policy server {self.base_url}{path} sent a body that is not JSON") from None
        finally:
            response.release()

    async def _post(self, path: str, body: dict, root: bool = False, headers: dict | None = None) -> dict:
        return await self._json(await self._open(path, body, root, headers), path)

    async def _events(self, path: str, body: dict, headers: dict | None = None) -> AsyncIterator[dict]:
        """The JSON events of a server-sent-event stream, up to [DONE]. Leaving early closes the
        connection, which tells the server to stop generating."""
        response = await self._open(path, body, headers=headers)
        done = False
        try:
            async for raw in response.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    return
                event = json.loads(data)
                if "error" in event:
                    raise Unavailable(f"policy server failed mid-stream: {_error_message_of(event)}")
                yield event
        except READ_TIMEOUTS as exc:
            raise DeadlineExceeded(f"policy server stream stalled: {exc!r}") from None
        except (aiohttp.ClientError, ValueError) as exc:
            raise Unavailable(f"policy server stream broke off: {type(exc).__name__}: {exc}") from None
        finally:
            if done:
                response.release()
            else:
                response.close()

    def _traced(self, operation: str, body: dict):
        """A client span for one generation (tracing.client_call): its model and token limit now,
        its usage and finish reason once the reply is in."""
        return tracing.client_call(f"policy {operation}", {
            "gen_ai.operation.name": operation, "gen_ai.request.model": body["model"],
            "gen_ai.request.max_tokens": body["max_tokens"], "server.address": self.base_url,
        })

    def _body(self, max_tokens: int, temperature: float, top_p: float, stop, seed, extra: dict, chat: bool = False) -> dict:
        body = {"model": self.served_model, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, **self._token_ids}
        if self._logprobs:  # the sampled token's alone: completions' logprobs 0, chat's logprobs true (top_logprobs 0)
            body |= {"logprobs": True, "top_logprobs": 0} if chat else {"logprobs": 0}
        body |= extra
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
        with self._traced("text_completion", body) as span:
            reply = await self._post("/completions", body, headers=tracing.trace_headers(span))
            choice = (reply.get("choices") or [{}])[0]
            done = Completion(choice.get("text") or "", choice.get("finish_reason"), Usage.of(reply.get("usage")), choice.get("token_ids"),
                              _sampled_logprobs(choice, choice.get("token_ids")))
            _describe(span, done.usage, done.finish_reason)
            return done

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
        body = self._body(max_tokens, temperature, top_p, stop, seed, extra, chat=True) | {"messages": messages}
        body |= _tool_fields(tools, tool_choice)
        with self._traced("chat", body) as span:
            reply = await self._post("/chat/completions", body, headers=tracing.trace_headers(span))
            choice = (reply.get("choices") or [{}])[0]
            _describe(span, Usage.of(reply.get("usage")), choice.get("finish_reason"))
        message = choice.get("message") or {}
        return ChatCompletion(
            content=message.get("content"),
            reasoning_content=message.get("reasoning_content") or message.get("reasoning"),
            tool_calls=[ToolCall.of(call) for call in message.get("tool_calls") or []],
            finish_reason=choice.get("finish_reason"),
            usage=Usage.of(reply.get("usage")),
            message=message,
            token_ids=choice.get("token_ids"),
            logprobs=_sampled_logprobs(choice, choice.get("token_ids")),
        )

    async def render_chat(self, messages: list[dict], *, tools: list[dict] | None = None, chat_template_kwargs: dict | None = None,
                          continue_final_message: bool = False) -> str:
        """The prompt text the engine's chat template makes of chat messages (its /tokenize, then
        /detokenize, on vLLM and the built-in server alike), for a completion that goes on from
        it: a chat completion comes back split by the engine's parsers, a completion as sampled."""
        body = {"model": self.served_model, "messages": messages, "tools": tools, "chat_template_kwargs": chat_template_kwargs,
                "chat_template": self.chat_template, "add_generation_prompt": not continue_final_message,
                "continue_final_message": continue_final_message}
        tokens = (await self._post("/tokenize", {key: value for key, value in body.items() if value is not None}, root=True))["tokens"]
        return (await self._post("/detokenize", {"model": self.served_model, "tokens": tokens}, root=True))["prompt"]

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
        finish, usage, ids = None, None, _TokenIds()
        with self._traced("text_completion", body) as span:
            async for event in self._events("/completions", body, tracing.trace_headers(span)):
                usage = Usage.of(event["usage"]) if event.get("usage") else usage
                for choice in event.get("choices") or []:
                    finish = choice.get("finish_reason") or finish
                    ids.add(choice)
                    if choice.get("text"):
                        yield StreamChunk(text=choice["text"])
            _describe(span, usage, finish)
        yield StreamChunk(finish_reason=finish, usage=usage, token_ids=ids.all, logprobs=ids.matching_logprobs)

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
        body = self._body(max_tokens, temperature, top_p, stop, seed, extra, chat=True)
        body |= {"messages": messages, "stream": True, "stream_options": {"include_usage": True}}
        body |= _tool_fields(tools, tool_choice)
        finish, usage, ids = None, None, _TokenIds()
        pending: dict[int, dict] = {}  # vLLM sends a call's arguments in several deltas
        with self._traced("chat", body) as span:
            async for event in self._events("/chat/completions", body, tracing.trace_headers(span)):
                usage = Usage.of(event["usage"]) if event.get("usage") else usage
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    finish = choice.get("finish_reason") or finish
                    ids.add(choice)
                    for call in delta.get("tool_calls") or []:
                        _merge_call(pending.setdefault(call.get("index", 0), {"function": {"arguments": ""}}), call)
                    text, reasoning = delta.get("content") or "", delta.get("reasoning_content") or delta.get("reasoning") or ""
                    if text or reasoning:
                        yield StreamChunk(text=text, reasoning=reasoning)
            _describe(span, usage, finish)
        calls = [ToolCall.of(call) for _, call in sorted(pending.items())]
        yield StreamChunk(tool_calls=calls, finish_reason=finish, usage=usage, token_ids=ids.all, logprobs=ids.matching_logprobs)

    async def models(self) -> list[str]:
        """The model names the server serves."""
        return [card["id"] for card in await self.model_cards()]

    async def model_cards(self) -> list[dict]:
        """The server's /v1/models entries (vLLM's LoRA adapters carry their base as parent)."""
        response = await self._unary("GET", "/models")
        return (await self._json(response, "/models")).get("data", [])

    async def engine(self) -> str:
        """The engine serving base_url, asked once per client: BUILTIN, VLLM or OTHER, from the
        owned_by of its /v1/models entries ("gearshift" for the built-in server, "vllm")."""
        if self._engine is None:
            owners = {card.get("owned_by") for card in await self.model_cards()}
            self._engine = VLLM if VLLM in owners else BUILTIN if BUILTIN in owners else OTHER
        return self._engine

    async def load(self, model: str, served_model_name: str | None = None, admin_token: str | None = None) -> dict:
        """Asks the built-in server to switch checkpoints (POST /v1/load); returns its report."""
        body = {"model": model} | ({"served_model_name": served_model_name} if served_model_name else {})
        headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else None
        return await self._json(await self._unary("POST", "/load", json=body, headers=headers), "/load")

    async def load_lora_adapter(self, name: str, path: str, in_place: bool = False) -> None:
        """Asks vLLM to serve a LoRA adapter under name (POST /v1/load_lora_adapter); an adapter
        already loaded under name is fine, or with in_place replaced by this one. A vLLM started
        without what runtime LoRA needs is a FailedPrecondition naming the missing flag."""
        body = {"lora_name": name, "lora_path": path} | ({"load_inplace": True} if in_place else {})
        try:
            response = await self._unary("POST", "/load_lora_adapter", json=body)
        except _RouteMissing:
            raise FailedPrecondition(
                f"vLLM at {self.base_url} refused runtime LoRA loading: start it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
            ) from None
        except InvalidArgument as exc:
            if "already been loaded" in str(exc):
                return
            raise _vllm_refusal(exc) from None
        response.release()

    async def unload_lora_adapter(self, name: str) -> None:
        """Asks vLLM to stop serving the LoRA adapter name (POST /v1/unload_lora_adapter); one
        it does not serve is fine."""
        try:
            response = await self._unary("POST", "/unload_lora_adapter", json={"lora_name": name})
        except _RouteMissing:
            raise FailedPrecondition(
                f"vLLM at {self.base_url} refused runtime LoRA unloading: start it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
            ) from None
        except InvalidArgument as exc:
            if "cannot be found" in str(exc):
                return
            raise
        response.release()

    async def serve_adapter(self, alias: str, version: int, path: str) -> str:
        """vLLM serves the LoRA adapter directory path as versioned(alias, version), and no other
        version of alias; returns the new name. A new name per version, since vLLM keeps prefix
        blocks cached under a name it reloads in place; a name already served (left by an
        interrupted run) is unloaded first. Clients asking for alias move to the new name on their
        next request (the one they used is gone)."""
        await self._require(VLLM, "serve LoRA adapters at run time")
        name = versioned(alias, version)
        if name in await self.models():
            await self.unload_lora_adapter(name)
        await self.load_lora_adapter(name, path)
        for other in await self.models():
            if other != name and other.startswith(alias + VERSION_MARK):
                await self.unload_lora_adapter(other)
        return name

    async def switch_weights(self, checkpoint: str, admin_token: str | None = None) -> None:
        """Makes the server generate with the full weights of the checkpoint directory (a path
        the server can read), by its engine's route: the built-in server loads it beside the old
        weights and swaps (POST /v1/load); vLLM reloads it into the running model in place
        (POST /collective_rpc reload_weights; it needs VLLM_SERVER_DEV_MODE=1), then drops the
        prefix blocks it cached with the old weights (POST /reset_prefix_cache)."""
        if await self.engine() == BUILTIN:
            await self.load(checkpoint, admin_token=admin_token)
            return
        await self._require(VLLM, "load new full weights")
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": checkpoint}}
        try:
            (await self._unary("POST", "/collective_rpc", root=True, json=rpc)).release()
            (await self._unary("POST", "/reset_prefix_cache", root=True)).release()
        except _RouteMissing:
            raise FailedPrecondition(
                f"vLLM at {self.base_url} has no /collective_rpc to reload full weights with: start it with VLLM_SERVER_DEV_MODE=1"
            ) from None

    async def vllm_admin(self, route: str, body: dict | None = None, params: dict | None = None) -> None:
        """POSTs one of vLLM's routes at its root that take weights over NCCL (/pause,
        /init_weight_transfer_engine, /start_weight_update, /update_weights, /finish_weight_update,
        /resume, /reset_prefix_cache, /shutdown_weight_transfer_engine; gearshift.training.
        weight_transfer drives them). They exist when vLLM runs with VLLM_SERVER_DEV_MODE=1."""
        await self._require(VLLM, "receive weights over NCCL")
        try:
            (await self._unary("POST", route, root=True, json=body, params=params)).release()
        except _RouteMissing:
            raise FailedPrecondition(f"vLLM at {self.base_url} has no {route}: start it with VLLM_SERVER_DEV_MODE=1") from None

    async def vllm_workers(self) -> int:
        """How many worker processes vLLM runs (tensor x pipeline x data parallel): each is a member
        of a weight-transfer group (GET /server_info, a VLLM_SERVER_DEV_MODE route)."""
        await self._require(VLLM, "receive weights over NCCL")
        try:
            info = await self._json(await self._unary("GET", "/server_info", root=True, params={"config_format": "json"}), "/server_info")
        except _RouteMissing:
            raise FailedPrecondition(f"vLLM at {self.base_url} has no /server_info: start it with VLLM_SERVER_DEV_MODE=1") from None
        try:
            parallel = info["vllm_config"]["parallel_config"]
            return int(parallel["tensor_parallel_size"]) * int(parallel["pipeline_parallel_size"]) * int(parallel["data_parallel_size"])
        except (KeyError, TypeError, ValueError):
            raise Unavailable(f"vLLM at {self.base_url} sent a /server_info without its parallel config") from None

    async def _require(self, engine: str, action: str) -> None:
        found = await self.engine()
        if found != engine:
            raise FailedPrecondition(
                f"the policy server at {self.base_url} is {ENGINE_NAMES[found]}, which cannot {action}: that takes {ENGINE_NAMES[engine]}"
            )

    async def _unary(self, method: str, path: str, root: bool = False, **kwargs) -> aiohttp.ClientResponse:
        """One request without retries (admin calls); errors become domain errors."""
        try:
            response = await self._request(method, path, root, admin=True, **kwargs)
        except aiohttp.ClientConnectionError as exc:
            raise Unavailable(f"policy server {self.base_url} unreachable: {exc}") from None
        if response.status >= 400:
            raise await self._client_error(response)
        return response


class _TokenIds:
    """A streamed reply's sampled ids and their log-probabilities: each chunk's token_ids (and
    logprobs) are the ones new since the last."""

    def __init__(self):
        self.all: list[int] | None = None
        self.logprobs: list[float] = []

    def add(self, choice: dict) -> None:
        if choice.get("token_ids") is not None:
            self.all = (self.all or []) + list(choice["token_ids"])
        self.logprobs += _logprob_values(choice.get("logprobs"))

    @property
    def matching_logprobs(self) -> list[float] | None:
        """The log-probabilities when there is one for every sampled id, else None."""
        return list(self.logprobs) if self.all and len(self.logprobs) == len(self.all) else None


def _logprob_values(logprobs: dict | None) -> list[float]:
    """The sampled tokens' log-probabilities of an OpenAI choice's logprobs: chat's content[].logprob
    or completions' token_logprobs (vLLM and the built-in server both)."""
    if not logprobs:
        return []
    if logprobs.get("content") is not None:
        return [float(entry["logprob"]) for entry in logprobs["content"]]
    return [float(value) for value in logprobs.get("token_logprobs") or []]


def _sampled_logprobs(choice: dict, token_ids: list[int] | None) -> list[float] | None:
    """A finished choice's log-probabilities when there is one for every sampled id, else None."""
    values = _logprob_values(choice.get("logprobs"))
    return values if token_ids and len(values) == len(token_ids) else None


def _describe(span, usage: Usage | None, finish_reason: str | None) -> None:
    """A policy call's span gets its prompt and completion tokens and its finish reason."""
    if span is not None:
        tracing.annotate(span, **(usage.span_attributes() if usage else {}), **{"gen_ai.response.finish_reasons": (finish_reason or "",)})


def _tool_fields(tools: list[dict] | None, tool_choice: str | dict | None) -> dict:
    """The chat body's tool fields, left out when not given (some servers reject nulls)."""
    return ({"tools": tools} if tools else {}) | ({"tool_choice": tool_choice} if tool_choice is not None else {})


def _vllm_refusal(exc: InvalidArgument) -> GearshiftError:
    """A FailedPrecondition naming the flag vLLM was started without, or exc itself."""
    for sign, fix in VLLM_REFUSALS.items():
        if sign in str(exc):
            return FailedPrecondition(f"{fix} ({exc})")
    return exc


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
