"""Traces and log ids over real loopback gRPC (the router, answering forced modes without the
policy), exported over the wire to an OTLP receiver: a caller's trace continues in the service,
sampling follows the caller, and nothing is traced or sent with tracing off."""

from __future__ import annotations

import asyncio
import contextvars
import io
import json
import logging

import grpc
import httpx
import pytest
from gearshift import logs, tracing
from gearshift.api.common.v1.common_pb2 import Mode
from gearshift.api.router.v1 import router_pb2, router_pb2_grpc
from gearshift.clients import channel
from gearshift.server import running
from gearshift.services.router.service import build
from gearshift.settings import Settings, TracingSettings
from gearshift.testing.otlp_receiver import OtlpReceiver

FORCED = router_pb2.RouteRequest(query="hi", forced_mode=Mode.MODE_INSTANT)


def traced(settings: Settings, receiver: OtlpReceiver, ratio: float) -> Settings:
    return settings.model_copy(update={"tracing": TracingSettings(enabled=True, otlp_endpoint=receiver.endpoint, sample_ratio=ratio)})


async def exported(receiver: OtlpReceiver, trace_id: str, count: int) -> list:
    """The trace's spans once count have arrived (client spans end a moment after their call)."""
    for _ in range(100):
        await asyncio.sleep(0.02)
        tracing.flush()
        if len(spans := receiver.trace(trace_id)) >= count:
            return spans
    return receiver.trace(trace_id)


async def test_a_call_continues_the_callers_trace(settings):
    with OtlpReceiver() as receiver:
        settings = traced(settings, receiver, ratio=1.0)
        async with running(await build(settings), settings) as server, channel(f"127.0.0.1:{server.port}", settings) as ch:
            stub = router_pb2_grpc.RouterStub(ch)
            with tracing.serving(tracing.setup(settings, "caller"), "caller", {}) as root:
                await stub.Route(FORCED)
                with pytest.raises(grpc.aio.AioRpcError):
                    await stub.Route(router_pb2.RouteRequest(query="   "))
            trace_id = format(root.get_span_context().trace_id, "032x")
            spans = await exported(receiver, trace_id, 5)
    by_name = {(span.service, span.name, span.attributes.get("rpc.grpc.status_code")): span for span in spans}
    route = "gearshift.router.v1.Router/Route"
    assert set(by_name) == {("caller", "caller", None), ("caller", route, 0), ("router", route, 0),
                            ("caller", route, 3), ("router", route, 3)}
    assert by_name["router", route, 0].parent_span_id == by_name["caller", route, 0].span_id
    assert by_name["caller", route, 0].parent_span_id == by_name["caller", "caller", None].span_id
    assert by_name["router", route, 3].parent_span_id == by_name["caller", route, 3].span_id


async def test_sampling_follows_the_caller(settings):
    """At ratio 0 a service records no trace of its own, but goes on with a sampled caller's:
    a trace is whole or absent."""
    with OtlpReceiver() as receiver:
        quiet = traced(settings, receiver, ratio=0.0)
        async with running(await build(quiet), quiet) as server, channel(f"127.0.0.1:{server.port}", settings) as ch:
            stub = router_pb2_grpc.RouterStub(ch)
            await stub.Route(FORCED)  # no trace context: the router's own decision, never
            caller = traced(settings, receiver, ratio=1.0)
            with tracing.serving(tracing.setup(caller, "caller"), "caller", {}) as root:
                await stub.Route(FORCED)
            trace_id = format(root.get_span_context().trace_id, "032x")
            spans = await exported(receiver, trace_id, 3)
    assert sorted(span.service for span in spans) == ["caller", "caller", "router"]
    assert {span.trace_id for span in receiver.spans} == {trace_id}


async def test_tracing_off_sends_no_trace_context(settings):
    assert tracing.setup(settings, "router") is None
    with tracing.serving(None, "caller", {}) as root:
        assert root is None and tracing.trace_headers() == {} and tracing.start_client_span("x") is None


def test_json_lines_carry_the_ids():
    stream = io.StringIO()
    logger = logging.getLogger("gearshift.test_tracing")
    logger.addHandler(logs.handler("json", stream))
    logger.setLevel(logging.INFO)

    def episode(settings: Settings) -> str:
        with tracing.serving(tracing.setup(settings, "caller"), "caller", {}) as root:
            logs.begin_request()
            logs.request_id.set("r-1")
            tracing.bind_trajectory("t-1")
            logger.info("inside %s", "the episode")
        logger.info("outside")
        return format(root.get_span_context().trace_id, "032x")

    try:
        with OtlpReceiver() as receiver:
            # A context of its own: the ids set here must not outlive the test.
            trace_id = contextvars.copy_context().run(episode, traced(Settings(), receiver, ratio=1.0))
            tracing.flush()
    finally:
        logger.handlers.clear()
    inside, outside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert inside["message"] == "inside the episode" and inside["level"] == "INFO"
    assert (inside["trace_id"], inside["request_id"], inside["trajectory_id"]) == (trace_id, "r-1", "t-1")
    assert len(inside["span_id"]) == 16 and outside["trace_id"] == "-"


async def test_http_requests_continue_the_clients_trace_and_probes_stay_untraced():
    """The gateway's and the policy server's middleware: a client's traceparent is continued, the
    caller's trajectory id reaches the request's log lines, /health makes no span."""
    seen = {}

    async def app(scope, receive, send):
        seen[scope["path"]] = logs.trajectory_id()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with OtlpReceiver() as receiver:
        settings = traced(Settings(), receiver, ratio=0.0)  # the client's sampled flag decides
        transport = httpx.ASGITransport(tracing.TracedHttp(app, tracing.setup(settings, "http-test")))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            await http.post("/v1/chat/completions", headers={"traceparent": parent, "x-trajectory-id": "t-9"})
            await http.get("/health", headers={"traceparent": parent})
        spans = await exported(receiver, "0af7651916cd43dd8448eb211c80319c", 1)
    assert [(span.name, span.parent_span_id, span.attributes["http.response.status_code"]) for span in spans] == [
        ("POST /v1/chat/completions", "b7ad6b7169203331", 200)]
    assert seen == {"/v1/chat/completions": "t-9", "/health": "-"}
