"""An OTLP/gRPC trace receiver for tests: a real collector endpoint on loopback that keeps every
span it is sent, decoded with the OpenTelemetry protocol's own messages."""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class ReceivedSpan:
    service: str  # the resource's service.name
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root
    attributes: dict


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Serves opentelemetry.proto.collector.trace.v1.TraceService on a loopback port (0: a free one)."""

    def __init__(self, port: int = 0):
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def Export(self, request, context):
        received = []
        for resource_spans in request.resource_spans:
            resource = {item.key: _value(item.value) for item in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(ReceivedSpan(
                        service=resource.get("service.name", ""), name=span.name, trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(), parent_span_id=span.parent_span_id.hex(),
                        attributes={item.key: _value(item.value) for item in span.attributes},
                    ))
        with self._lock:
            self.spans.extend(received)
        return trace_service_pb2.ExportTraceServiceResponse()

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [span for span in self.spans if span.trace_id == trace_id]

    def __enter__(self) -> OtlpReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.stop(grace=None)
