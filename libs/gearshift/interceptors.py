"""The one server interceptor every service runs: request ids, bearer-token auth, domain
error -> status mapping, undecodable requests -> INVALID_ARGUMENT, Prometheus metrics, a
server span per call that continues the caller's trace (when tracing is on), and the incoming
call's deadline as the deadline of the work in hand (gearshift.deadlines), which bounds every
call the handler makes in turn (gRPC calls and policy requests)."""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from prometheus_client import Counter, Gauge, Histogram

from gearshift import deadlines, logs, tracing
from gearshift.errors import GearshiftError
from gearshift.logs import REQUEST_ID_KEY, TRAJECTORY_ID_KEY, request_id

log = logging.getLogger("gearshift.rpc")

__all__ = ["REQUEST_ID_KEY", "TRAJECTORY_ID_KEY", "RequestInterceptor", "request_id"]

# Kubernetes gRPC probes cannot send a token, so health checks stay open.
UNAUTHENTICATED_METHODS = ("/grpc.health.v1.Health/",)

# Downstream statuses that describe the caller's request or availability, passed on as they are;
# anything else from downstream (auth, internal) is this service's fault: INTERNAL.
PASSED_ON = {
    code: code
    for code in (
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )
}

HANDLED = Counter("grpc_server_handled_total", "RPCs completed", ["service", "method", "code"])
LATENCY = Histogram(
    "grpc_server_handling_seconds",
    "RPC latency until the last response",
    ["service", "method"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
# gRFC A6 server pushback: a negative value tells the caller's channel not to retry the call.
# A handler of ours that fails UNAVAILABLE does so because something it called was unavailable (a
# downstream service after its own channel's retries, the policy server after the policy client's,
# the store's database): retrying it from above would only repeat those retries, attempts
# multiplying layer by layer (a Route 4 times, each with 4 policy requests). Pushback rather than
# another status: the caller still sees UNAVAILABLE, which is what happened (the gateway answers
# 503, the executor's durable store spools), and the failed attempt still counts against the
# caller's retry budget. An UNAVAILABLE that gRPC itself produces (a replica gone, draining,
# refusing connections) carries no pushback and is retried on another replica as before.
RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"
NO_RETRY = ((RETRY_PUSHBACK_KEY, "-1"),)

IN_FLIGHT = Gauge("grpc_server_in_flight", "RPCs being handled (health watches included)", ["service", "method"])


class _Undecodable:
    """Stands in for a request whose bytes did not parse, so the handler can refuse it."""

    def __init__(self, error: Exception):
        self.error = error


def _tolerant(deserializer):
    if deserializer is None:
        return None

    def parse(data: bytes):
        try:
            return deserializer(data)
        except (DecodeError, ValueError) as exc:
            return _Undecodable(exc)

    return parse


class RequestInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, auth_token: str | None = None, tracer=None):
        self._token = f"Bearer {auth_token}".encode() if auth_token else None
        self._tracer = tracer  # the service's (gearshift.tracing.setup); None: tracing off

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        metadata = dict(details.invocation_metadata or ())
        rid = metadata.get(REQUEST_ID_KEY) or uuid.uuid4().hex[:16]
        authorized = self._authorized(method, metadata)
        service, _, name = method.rpartition("/")
        service = service.lstrip("/")
        in_flight = IN_FLIGHT.labels(service, name)

        def spanning():
            if self._tracer is None or method.startswith(UNAUTHENTICATED_METHODS):  # off, or a probe: untraced
                return tracing.serving(None, method, metadata)
            attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name, "gearshift.request_id": rid}
            return tracing.serving(self._tracer, f"{service}/{name}", metadata, attributes=attributes)

        async def prologue(request, context) -> None:
            request_id.set(rid)
            logs.begin_request(metadata.get(TRAJECTORY_ID_KEY))
            deadlines.limit(context.time_remaining())  # this call's task alone: the calls it makes end by then
            context.set_trailing_metadata(((REQUEST_ID_KEY, rid),))
            if not authorized:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
            if isinstance(request, _Undecodable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request does not parse: {request.error}")

        async def abort(context, code: grpc.StatusCode, details: str) -> None:
            pushback = NO_RETRY if code == grpc.StatusCode.UNAVAILABLE else ()
            await context.abort(code, details, trailing_metadata=((REQUEST_ID_KEY, rid), *pushback))

        async def fail(exc: BaseException, context) -> None:
            if isinstance(exc, GearshiftError):
                await abort(context, exc.code, str(exc))
            if isinstance(exc, grpc.aio.AioRpcError) and exc.code() in PASSED_ON:
                # A downstream service refused what this request carried, or is down: say so.
                await abort(context, PASSED_ON[exc.code()], f"downstream: {exc.details()}")
            log.exception("%s failed (request %s)", method, rid)
            await abort(context, grpc.StatusCode.INTERNAL, f"internal error (request id {rid})")

        def begin() -> float:
            in_flight.inc()
            return time.perf_counter()

        def record(started: float, context, span) -> None:
            in_flight.dec()
            code = context.code() if hasattr(context, "code") else None
            HANDLED.labels(service, name, (code or grpc.StatusCode.OK).name if code else "OK").inc()
            LATENCY.labels(service, name).observe(time.perf_counter() - started)
            if span is not None:
                span.set_attribute("rpc.grpc.status_code", (code or grpc.StatusCode.OK).value[0])

        if handler.unary_unary:
            inner = handler.unary_unary

            async def unary_unary(request, context):
                started = begin()
                with spanning() as span:
                    try:
                        await prologue(request, context)
                        return await inner(request, context)
                    except Exception as exc:  # noqa: BLE001 - every failure becomes a status
                        if _is_abort(exc):
                            raise
                        await fail(exc, context)
                    finally:
                        record(started, context, span)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, _tolerant(handler.request_deserializer), handler.response_serializer
            )
        if handler.unary_stream:
            inner_stream = handler.unary_stream

            async def unary_stream(request, context):
                started = begin()
                with spanning() as span:
                    try:
                        await prologue(request, context)
                        stream = inner_stream(request, context)
                        if hasattr(stream, "__aiter__"):
                            async for item in stream:
                                yield item
                        else:  # a handler that writes with context.write (the health service's Watch)
                            await stream
                    except Exception as exc:  # noqa: BLE001
                        if _is_abort(exc):
                            raise
                        await fail(exc, context)
                    finally:
                        record(started, context, span)

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, _tolerant(handler.request_deserializer), handler.response_serializer
            )
        return handler  # client-streaming rpcs: gearshift defines none

    def _authorized(self, method: str, metadata: dict[str, Any]) -> bool:
        if self._token is None or method.startswith(UNAUTHENTICATED_METHODS):
            return True
        given = metadata.get("authorization", "")
        given = given.encode() if isinstance(given, str) else given
        return hmac.compare_digest(given, self._token)


def _is_abort(exc: BaseException) -> bool:
    return isinstance(exc, grpc.aio.AbortError) or type(exc).__name__ == "AbortError"
