"""The gateway's ASGI layers, outermost first: Prometheus metrics of every request, request ids,
the access log (a setting), bearer-token auth on /v1 (before a body is read), admission control
(admission.py) and the body size limit (before it is parsed)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gearshift.interceptors import REQUEST_ID_KEY, request_id
from gearshift.openai_http import error_response
from gearshift.services.gateway.api_keys import ANONYMOUS_KEY_NAME, ApiKeys
from gearshift.settings import GatewaySettings

ROUTES = ("/v1/chat/completions", "/v1/feedback", "/v1/models", "/health", "/ready", "/metrics")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class GatewayMetrics:
    """The gateway's metrics, in a registry of its own (one per app: several can run in a process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("gearshift_gateway_requests", "HTTP requests answered", ["route", "model", "status"], registry=self.registry)
        self.latency = Histogram("gearshift_gateway_request_seconds", "Seconds from a request to the last byte of its reply (streams "
                                 "included)", ["route", "model"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.in_flight = Gauge("gearshift_gateway_in_flight", "Requests being answered", registry=self.registry)
        self.routing = Histogram("gearshift_gateway_routing_seconds", "Seconds from a completion request to its mode decision",
                                 ["model"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.cancelled = Counter("gearshift_gateway_cancelled", "Completions whose client went away before the end (Solve cancelled)",
                                 ["model"], registry=self.registry)
        self.refused = Counter("gearshift_gateway_admission_refused", "Requests refused 429 by admission control, by reason "
                               "(rate_limit_exceeded, concurrency_limit_exceeded)", ["reason"], registry=self.registry)


def route_of(path: str) -> str:
    return next((route for route in ROUTES if path == route or path.startswith(route + "/")), "other")


class Metrics:
    """Counts each request by route, model (set by the handler in request.state) and status."""

    def __init__(self, app, metrics: GatewayMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), "499"  # no reply started: the client went away

        async def sending(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.in_flight.dec()
            route, model = route_of(scope["path"]), scope.get("state", {}).get("model", "-")
            self.metrics.requests.labels(route, model, status).inc()
            self.metrics.latency.labels(route, model).observe(time.perf_counter() - started)


class RequestIds:
    """Takes the request id from x-request-id (or makes one), sets it where the gRPC clients put
    it in the metadata of the calls the request makes, and returns it in the reply's headers."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(REQUEST_ID_KEY.encode(), b"").decode("latin-1")[:64]
        rid = given or uuid.uuid4().hex[:16]
        request_id.set(rid)

        async def sending(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (REQUEST_ID_KEY.encode(), rid.encode("latin-1"))]}
            await send(message)

        return await self.app(scope, receive, sending)


class AccessLog:
    """A line per request, as uvicorn's access log writes it, when the reply starts: the request
    and trajectory ids and the trace are still those of the request then (JSON lines carry them).
    The gateway's own logger: uvicorn's is one per process, which an embedded server turns off."""

    def __init__(self, app):
        self.app = app
        self.log = logging.getLogger("gearshift.gateway.access")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def sending(message):
            if message["type"] == "http.response.start":
                client = "%s:%d" % tuple(scope["client"]) if scope.get("client") else "-"
                self.log.info('%s - "%s %s HTTP/%s" %d', client, scope["method"], scope["path"], scope["http_version"], message["status"])
            await send(message)

        return await self.app(scope, receive, sending)


class BearerAuth:
    """Requires `Authorization: Bearer <API key>` on /v1 when keys are required, and puts the key's
    name in request.state.api_key; /health, /ready and /metrics stay open, as the gRPC services
    leave their health checks open for probes."""

    def __init__(self, app, keys: ApiKeys):
        self.app = app
        self.keys = keys

    async def __call__(self, scope, receive, send):
        if self.keys.required and scope["type"] == "http" and scope["path"].startswith("/v1"):
            name = key_name(self.keys, dict(scope["headers"]).get(b"authorization", b"").decode("latin-1"))
            if name is None:
                return await error_response(401, "missing, wrong or revoked API key: send Authorization: Bearer <your API key>")(
                    scope, receive, send)
            scope.setdefault("state", {})["api_key"] = name
        return await self.app(scope, receive, send)


def key_name(keys: ApiKeys, authorization: str) -> str | None:
    """The name of the key an Authorization header carries: None for no current key, `anonymous`
    where the gateway requires none."""
    if not keys.required:
        return ANONYMOUS_KEY_NAME
    return keys.name_of(authorization.removeprefix("Bearer ")) if authorization.startswith("Bearer ") else None


def trace_trust(keys: ApiKeys, config: GatewaySettings) -> Callable[[Mapping[str, str]], bool]:
    """Whether a request's headers name a key trusted to force its trace's sampling
    (tracing.TracedHttp asks before authentication: the key is looked up once more)."""

    def trusted(headers: Mapping[str, str]) -> bool:
        name = key_name(keys, headers.get("authorization", ""))
        return name is not None and bool(config.key_policy(name).trust_trace)

    return trusted


class BodyLimit:
    """Answers 413 to a body over max_bytes, declared or streamed, before the app parses it;
    the app then reads the body from memory and the client's disconnect from the connection."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._too_large(scope, receive, send)
            if not message.get("more_body"):
                break
        body, delivered = b"".join(chunks), False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

    async def _too_large(self, scope, receive, send):
        return await error_response(413, f"request body larger than {self.max_bytes} bytes")(scope, receive, send)
