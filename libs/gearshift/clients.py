"""Client channels between services: balanced over every replica an address resolves to, with a
deadline on every call (the service's, or sooner the deadline of the work in hand: the caller's
own, an episode's budget; gearshift.deadlines), retries past a dead replica for idempotent
methods within a retry budget (retryThrottling), keepalive, the bearer token, message limits,
and a request id, trajectory id and trace context (a client span per call, when tracing is on)
that follow a request from service to service.

Retries do not multiply across layers: a service whose handler failed because a dependency was
unavailable answers UNAVAILABLE with server pushback (interceptors.py), which tells the channel
above it not to retry; UNAVAILABLE from gRPC itself (a replica gone, draining, refusing
connections) carries none and is retried on another replica."""

from __future__ import annotations

import asyncio
import json

import grpc

from gearshift import deadlines
from gearshift.api.executor.v1 import executor_pb2
from gearshift.api.planner.v1 import planner_pb2
from gearshift.api.reward.v1 import reward_pb2
from gearshift.api.router.v1 import router_pb2
from gearshift.api.sandbox.v1 import sandbox_pb2
from gearshift.api.store.v1 import store_pb2
from gearshift import logs, tls, tracing
from gearshift.settings import RpcSettings, Settings, get_settings

# Each gRPC service of the platform (the one service of its proto file) by its name in the services table.
FULL_NAMES = {
    name: next(iter(module.DESCRIPTOR.services_by_name.values())).full_name
    for name, module in (("router", router_pb2), ("planner", planner_pb2), ("executor", executor_pb2),
                         ("sandbox", sandbox_pb2), ("reward", reward_pb2), ("store", store_pb2))
}
# Methods that may run again on another replica when one answers UNAVAILABLE: they read, compute
# from their request alone, or write under a key the request names (Put by trajectory id,
# SetReward). Execute too: a call without a session runs in a fresh interpreter with no network,
# and a session's call on a replica that does not hold it is refused (NOT_FOUND), not run.
RETRIED = {
    "router": ("Route",),
    "planner": ("Regulate", "Plan"),
    "reward": ("Score", "Price", "CostOfPass"),
    "sandbox": ("ListTools", "Execute"),
    "store": ("Put", "Get", "Query", "SetReward", "GetCheckpoint", "ListCheckpoints"),
}
STREAMS = {"store": ("Export",)}  # long streams: their own deadline
MAX_BACKOFF_SECONDS = 1.0
DNS_RERESOLVE_MS = 2_000  # gRPC's default lets a channel re-resolve a name only every 30 s
# gRPC's default backoff after failed connects grows to 120 s: an address that comes back (a pod
# restarted on its IP, a replica started in a slot of an ipv4: target) waits at most this long.
MAX_RECONNECT_BACKOFF_MS = 5_000


class _Metadata:
    """Adds the token, the request and trajectory ids and the trace context to a call's metadata."""

    def __init__(self, token: str | None):
        self._auth = (("authorization", f"Bearer {token}"),) if token else ()

    def _details(self, details: grpc.aio.ClientCallDetails, span) -> grpc.aio.ClientCallDetails:
        metadata = list(details.metadata or ())
        metadata.extend(self._auth)
        metadata.extend(logs.id_headers().items())
        metadata.extend(tracing.trace_headers(span).items())
        # The call ends when the work in hand must: gRPC sends the deadline on, so the callee
        # bounds what it calls in turn (the service config's deadline still caps a longer one).
        return details._replace(metadata=metadata, timeout=deadlines.bound(details.timeout))

    async def _traced(self, continuation, details: grpc.aio.ClientCallDetails, request):
        """Starts the call under a client span that ends with it (streams too: after their end)."""
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        service, _, name = method.lstrip("/").rpartition("/")
        span = tracing.start_client_span(f"{service}/{name}", {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name})
        call = await continuation(self._details(details, span), request)
        if span is not None and span.is_recording():  # an unsampled trace's span records nothing: no end to wait for
            call.add_done_callback(lambda done: asyncio.ensure_future(_end_span(span, done)))
        return call


async def _end_span(span, call) -> None:
    code = await call.code()
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    tracing.end_call(span, None if code == grpc.StatusCode.OK else code.name)


# grpc.aio files each interceptor under the first call shape it implements (an if/elif on its
# base classes), so one object implementing all four would only ever see unary-unary calls and
# streaming calls (executor Solve, store Export) would go out without the token: one per shape.
class _UnaryUnary(_Metadata, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await self._traced(continuation, details, request)


class _UnaryStream(_Metadata, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await self._traced(continuation, details, request)


class _StreamUnary(_Metadata, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await self._traced(continuation, details, request_iterator)


class _StreamStream(_Metadata, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, request_iterator):
        return await self._traced(continuation, details, request_iterator)


def metadata_interceptors(token: str | None) -> list:
    """Client interceptors adding the token and request id to calls of every shape."""
    return [shape(token) for shape in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)]


def _seconds(value: float) -> str:
    return f"{value:.3f}s"


def service_config(rpc: RpcSettings) -> str:
    """The gRPC service config of every channel: round_robin over the resolved addresses (unless
    settings say pick_first), skipping replicas whose health service says NOT_SERVING (a draining
    pod), a deadline per service, a bounded retry policy for the idempotent methods, and a retry
    budget (retryThrottling, gRFC A6): every failed attempt takes a token, every success gives
    back token_ratio, and no call is retried while half the tokens or fewer are left. gRPC keeps
    one budget per target and process, shared by every channel to it: a dependency that is down
    costs about one attempt per call once the budget is spent, not retry_attempts."""
    retry = {
        "maxAttempts": rpc.retry_attempts,
        "initialBackoff": _seconds(rpc.retry_backoff_seconds),
        "maxBackoff": _seconds(max(MAX_BACKOFF_SECONDS, rpc.retry_backoff_seconds)),
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    methods = []
    for name, full_name in FULL_NAMES.items():
        deadline = _seconds(rpc.deadline_seconds.get(name, max(rpc.deadline_seconds.values())))
        methods.append({"name": [{"service": full_name}], "timeout": deadline})
        if name in RETRIED and rpc.retry_attempts > 1:
            names = [{"service": full_name, "method": method} for method in RETRIED[name]]
            methods.append({"name": names, "timeout": deadline, "retryPolicy": retry})
        if name in STREAMS:
            names = [{"service": full_name, "method": method} for method in STREAMS[name]]
            methods.append({"name": names, "timeout": _seconds(rpc.export_deadline_seconds)})
    return json.dumps({
        "loadBalancingConfig": [{rpc.load_balancing: {}}],
        "healthCheckConfig": {"serviceName": ""},
        "methodConfig": methods,
        "retryThrottling": {"maxTokens": rpc.retry_max_tokens, "tokenRatio": round(rpc.retry_token_ratio, 3)},  # gRPC reads 3 decimals
    })


def channel_options(settings: Settings) -> list[tuple[str, str | int]]:
    """Options of every client channel (service config, keepalive, message limits)."""
    rpc = settings.rpc
    size = settings.limits.max_message_bytes
    return [
        ("grpc.max_receive_message_length", size),
        ("grpc.max_send_message_length", size),
        ("grpc.service_config", service_config(rpc)),
        ("grpc.service_config_disable_resolution", 1),  # ours, not one from DNS TXT records
        ("grpc.enable_retries", 1),
        ("grpc.keepalive_time_ms", int(rpc.keepalive_seconds * 1000)),
        ("grpc.keepalive_timeout_ms", int(rpc.keepalive_timeout_seconds * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.dns_min_time_between_resolutions_ms", DNS_RERESOLVE_MS),
        ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    ]


def channel(address: str, settings: Settings | None = None) -> grpc.aio.Channel:
    """An aio channel to another gearshift service: address is any gRPC target (host:port,
    dns:///name:port, ipv4:a:p,b:p), balanced over what it resolves to, carrying the token."""
    settings = settings or get_settings()
    options, interceptors = channel_options(settings), metadata_interceptors(settings.token())
    if settings.tls.enabled:
        options += tls.channel_options(settings.tls)
        return grpc.aio.secure_channel(address, tls.channel_credentials(settings.tls), options=options, interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)


def service_channel(service: str, settings: Settings | None = None) -> grpc.aio.Channel:
    """A channel to a platform service by name ("store", "sandbox", ...)."""
    settings = settings or get_settings()
    return channel(settings.address_of(service), settings)
