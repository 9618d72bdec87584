"""Admission control at the gateway, per client key: a token bucket of requests a second with a
burst, and a bound on the key's requests in flight (a stream counts until its last event). A
request over either is answered 429 in OpenAI's shape with Retry-After before its body is read,
so one key's flood costs the other keys nothing but its refusals."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from gearshift.openai_http import error_response
from gearshift.settings import ClientKeyPolicy

# Keys are names from the keys file, but an open gateway limits by client address: past this many
# tracked, the idle ones (bucket full, nothing in flight) are forgotten.
MAX_TRACKED = 10_000
DRAIN_BYTES = 64 * 1024  # a refused request's body read rather than left (keeps its connection open)
DRAIN_SECONDS = 1.0


@dataclass
class Refusal:
    reason: str  # the error code: rate_limit_exceeded, concurrency_limit_exceeded
    message: str
    retry_after: int  # seconds


class KeyState:
    """One key's token bucket and requests in flight."""

    def __init__(self, policy: ClientKeyPolicy, now: float):
        self.policy = policy
        self.tokens = float(policy.burst)
        self.stamp = now
        self.in_flight = 0

    def refill(self, now: float) -> None:
        self.tokens = min(float(self.policy.burst), self.tokens + (now - self.stamp) * self.policy.rate_per_second)
        self.stamp = now

    def admit(self, now: float) -> Refusal | None:
        """Takes a token and a place in flight, or says why not (taking neither)."""
        policy = self.policy
        if policy.max_concurrent and self.in_flight >= policy.max_concurrent:
            return Refusal("concurrency_limit_exceeded", f"this API key has {self.in_flight} requests in flight, its limit: "
                           "retry when one ends", 1)
        if policy.rate_per_second:
            self.refill(now)
            if self.tokens < 1:
                wait = (1 - self.tokens) / policy.rate_per_second
                return Refusal("rate_limit_exceeded", f"this API key is limited to {policy.rate_per_second:g} requests a second "
                               f"(bursts of {policy.burst}): retry after the Retry-After header's seconds", max(1, math.ceil(wait)))
            self.tokens -= 1
        self.in_flight += 1
        return None

    def idle(self, now: float) -> bool:
        self.refill(now)
        return self.in_flight == 0 and self.tokens >= self.policy.burst


class Admission:
    """The ASGI layer after authentication (it reads the key's name BearerAuth put in the scope's
    state) and before the body limit: a request waiting on its body holds its place too."""

    def __init__(self, app, policy_of: Callable[[str], ClientKeyPolicy], refused: Callable[[str], None] = lambda reason: None,
                 clock: Callable[[], float] = time.monotonic):
        self.app = app
        self.policy_of = policy_of
        self.refused = refused  # counts a refusal by its reason (metrics)
        self.clock = clock
        self.keys: dict[str, KeyState] = {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1"):
            return await self.app(scope, receive, send)
        state = self._state(_key_of(scope))
        refusal = state.admit(self.clock())
        if refusal:
            self.refused(refusal.reason)
            # A body left unread makes the server drop the connection after the reply, under a client
            # that is already sending its next request on it: a small one is read, a large one closes it.
            try:
                drained = await asyncio.wait_for(_drained(scope, receive), DRAIN_SECONDS)
            except TimeoutError:  # a slow body is not waited for: the refusal takes no place in flight
                drained = False
            headers = None if drained else {"connection": "close"}
            return await error_response(429, refusal.message, code=refusal.reason, retry_after=refusal.retry_after,
                                        headers=headers)(scope, receive, send)
        try:
            return await self.app(scope, receive, send)
        finally:
            state.in_flight -= 1

    def _state(self, key: str) -> KeyState:
        state = self.keys.get(key)
        if state is None:
            now = self.clock()
            if len(self.keys) >= MAX_TRACKED:
                self.keys = {name: kept for name, kept in self.keys.items() if not kept.idle(now)}
            state = self.keys[key] = KeyState(self.policy_of(key), now)
        return state


async def _drained(scope, receive) -> bool:
    """Reads and drops a refused request's body, if it is at most DRAIN_BYTES; whether it was."""
    if scope["method"] not in ("POST", "PUT", "PATCH"):
        return True
    declared = dict(scope["headers"]).get(b"content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > DRAIN_BYTES):
        return False
    size = 0
    while size <= DRAIN_BYTES:
        message = await receive()
        if message["type"] != "http.request":
            return False
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            return True
    return False


def _key_of(scope) -> str:
    """The API key's name, else (an open gateway) the client's address."""
    name = scope.get("state", {}).get("api_key")
    if name:
        return name
    client = scope.get("client")
    return f"address {client[0]}" if client else "address -"
