"""OpenTelemetry traces: a span for every RPC at both ends, every HTTP request, policy call, tool
call and store write, joined into one trace per episode by W3C trace context (traceparent) in
gRPC metadata and HTTP headers. Off by default (Settings.tracing): then no span is made and no
trace context is sent, and each helper here costs a context-variable read.

Each service has a TracerProvider of its own, not the global one: the embedded platform runs
every service in one process, and each span must still name the service that made it. The
tracer of the service handling the current call travels in a context variable, so the clients it
calls through (gRPC channels, the policy client) record their spans under its name."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gearshift import logs
from gearshift.settings import Settings

UNTRACED_PATHS = ("/health", "/ready", "/metrics")  # probes and scrapes: a trace each would drown the episodes

_tracer: contextvars.ContextVar[Tracer | None] = contextvars.ContextVar("tracer", default=None)
_providers: dict[tuple, object] = {}  # (service, endpoint, ratio) -> its TracerProvider, one per process
_propagator = TraceContextTextMapPropagator()


def setup(settings: Settings, service: str) -> Tracer | None:
    """The tracer of service (made once per process), or None when tracing is off."""
    config = settings.tracing
    if not config.enabled:
        return None
    # The SDK and the exporter are imported only when tracing is on: an untraced service skips them.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    key = (service, config.otlp_endpoint, config.sample_ratio)
    if key not in _providers:
        ratio = TraceIdRatioBased(config.sample_ratio)
        provider = TracerProvider(
            # A parent that did not sample (an untrusted client's, see serving) is decided again by the
            # ratio, which gives every service the same answer for the same trace id.
            sampler=ParentBased(ratio, remote_parent_not_sampled=ratio),
            resource=Resource.create({"service.name": service, "service.namespace": "gearshift"}),
        )
        exporter = OTLPSpanExporter(endpoint=config.otlp_endpoint, insecure=not config.otlp_endpoint.startswith("https://"))
        provider.add_span_processor(BatchSpanProcessor(exporter))
        _providers[key] = provider
    return _providers[key].get_tracer("gearshift")


def flush(timeout_seconds: float = 10.0) -> None:
    """Exports every span ended so far (tests, benchmarks; a stopping process does it by itself)."""
    for provider in _providers.values():
        provider.force_flush(int(timeout_seconds * 1000))


@contextlib.contextmanager
def serving(tracer: Tracer | None, name: str, carrier: Mapping[str, str], kind: SpanKind = SpanKind.SERVER,
            attributes: Mapping[str, object] | None = None, follow_sampling: bool = True) -> Iterator[Span | None]:
    """The current span while a call is served: the child of the trace context carrier (gRPC
    metadata, HTTP headers) brings, or a new trace's root. Unless follow_sampling, the caller's
    sampled flag is dropped: the trace is continued, sampled as the ratio says. The service's
    clients record under tracer meanwhile. None, and nothing done, when tracing is off."""
    if tracer is None:
        yield None
        return
    context = _propagator.extract(carrier)
    if not follow_sampling:
        context = _unsampled(context)
    token = _tracer.set(tracer)
    try:
        with tracer.start_as_current_span(name, context=context, kind=kind, attributes=attributes) as span:
            yield span
    finally:
        _tracer.reset(token)


def _unsampled(context):
    """context with its remote parent's sampled flag cleared (the sampler then decides)."""
    parent = trace.get_current_span(context).get_span_context()
    if not parent.is_valid or not parent.trace_flags.sampled:
        return context
    cleared = SpanContext(parent.trace_id, parent.span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.DEFAULT),
                          trace_state=parent.trace_state)
    return trace.set_span_in_context(NonRecordingSpan(cleared), context)


def start_client_span(name: str, attributes: Mapping[str, object] | None = None) -> Span | None:
    """A span for an outgoing call, under the current span and not made current (it may end in
    another task, or after a stream the caller reads); None when the caller is untraced."""
    tracer = _tracer.get()
    if tracer is None:
        return None
    return tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attributes)


@contextlib.contextmanager
def client_call(name: str, attributes: Mapping[str, object] | None = None) -> Iterator[Span | None]:
    """start_client_span for the length of a block, failed if the block raises. Safe inside an
    async generator (a stream): the span is never made current, so nothing is detached later."""
    made = start_client_span(name, attributes)
    try:
        yield made
    except GeneratorExit:  # the caller stopped reading a stream: not a failure
        end_call(made)
        raise
    except BaseException as exc:
        end_call(made, type(exc).__name__)
        raise
    else:
        end_call(made)


@contextlib.contextmanager
def span(name: str, **attributes) -> Iterator[Span | None]:
    """A current span for a piece of work (a tool call), or None when the caller is untraced."""
    tracer = _tracer.get()
    if tracer is None:
        yield None
        return
    with tracer.start_as_current_span(name, attributes=attributes) as made:
        yield made


def publish_headers(name: str, fallback: Tracer | None = None) -> dict[str, str]:
    """A producer span for a message sent now (a Celery task), under the current span or, outside
    any, as a new trace of fallback's (the beat's); the traceparent the message carries to its
    consumer. {} when untraced."""
    tracer = _tracer.get() or fallback
    if tracer is None:
        return {}
    carrier: dict[str, str] = {}
    with tracer.start_as_current_span(name, kind=SpanKind.PRODUCER):
        _propagator.inject(carrier)
    return carrier


def trace_headers(client_span: Span | None = None) -> dict[str, str]:
    """The traceparent (and tracestate) of client_span, else of the current span; {} when untraced."""
    carrier: dict[str, str] = {}
    if _tracer.get() is not None:
        context = trace.set_span_in_context(client_span) if client_span is not None else None
        _propagator.inject(carrier, context=context)
    return carrier


def end_call(client_span: Span | None, failure: str | None = None) -> None:
    """Ends a span of start_client_span, as failed when failure names why."""
    if client_span is None:
        return
    if failure:
        client_span.set_status(Status(StatusCode.ERROR, failure))
    client_span.end()


def annotate(target: Span | None = None, **attributes) -> None:
    """Sets attributes (None values skipped) on target, else on the current span, if it records."""
    target = target or trace.get_current_span()
    if target.is_recording():
        target.set_attributes({key: value for key, value in attributes.items() if value is not None})


def bind_trajectory(trajectory_id: str) -> None:
    """The request works on trajectory_id: its later log lines and its current span carry it."""
    logs.bind_trajectory(trajectory_id)
    annotate(**{"gearshift.trajectory_id": trajectory_id})


def describe_episode(trajectory, target: Span | None = None) -> None:
    """An episode's attributes on its root span (the gateway's request, the executor's Solve):
    trajectory id, mode and why (routing strategy and rationale), tokens and cost."""
    from gearshift.api.common.v1 import common_pb2

    usage = trajectory.usage
    logs.bind_trajectory(trajectory.id)
    annotate(target, **{
        "gearshift.trajectory_id": trajectory.id,
        "gearshift.mode": common_pb2.Mode.Name(trajectory.mode),
        "gearshift.routing.strategy": common_pb2.RoutingStrategy.Name(trajectory.routing_strategy),
        "gearshift.routing.rationale": trajectory.routing_rationale,
        "gearshift.status": common_pb2.TrajectoryStatus.Name(trajectory.status),
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
        "gearshift.usage.cached_input_tokens": usage.cached_input_tokens,
        "gearshift.cost_usd": trajectory.cost.total_usd,
    })


class TracedHttp:
    """ASGI middleware of an HTTP service (the gateway, the policy server): a server span per
    request that continues the client's traceparent, and the request's log ids (the request and
    trajectory ids its caller sent). Probes and scrapes are left untraced. A traceparent forces
    sampling only where trusts_trace says its caller may (None: every caller, as the policy
    server's are the platform's own); anyone else's trace is sampled as the ratio says."""

    def __init__(self, app, tracer: Tracer | None, trusts_trace: Callable[[Mapping[str, str]], bool] | None = None):
        self.app = app
        self.tracer = tracer
        self.trusts_trace = trusts_trace

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]}
        logs.begin_request(headers.get(logs.TRAJECTORY_ID_KEY, "")[:64])
        if given := headers.get(logs.REQUEST_ID_KEY, "")[:64]:  # a caller's (the policy server's callers)
            logs.request_id.set(given)
        tracer = None if scope["path"] in UNTRACED_PATHS else self.tracer
        attributes = {"http.request.method": scope["method"], "url.path": scope["path"]}
        follow = tracer is None or self.trusts_trace is None or self.trusts_trace(headers)
        with serving(tracer, f"{scope['method']} {scope['path']}", headers, attributes=attributes, follow_sampling=follow) as current:
            if current is None:
                return await self.app(scope, receive, send)

            async def sending(message):
                if message["type"] == "http.response.start":
                    current.set_attribute("http.response.status_code", message["status"])
                    if message["status"] >= 500:
                        current.set_status(Status(StatusCode.ERROR))
                await send(message)

            await self.app(scope, receive, sending)
