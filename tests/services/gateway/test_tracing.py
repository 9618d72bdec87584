"""One episode through the gateway, traced and logged as production runs it: tracing on (ratio
1.0) exporting over OTLP/gRPC to a receiver the test runs, JSON log lines with the access log on.
The embedded platform runs every service over real loopback gRPC and the real built-in policy
server with the default policy; an agentic episode reaches the router, planner, sandbox and store."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import httpx
import pytest
from gearshift import logs, tracing, weights
from gearshift.embedded import embedded
from gearshift.settings import ExecutorSettings, GatewaySettings, LearnedRouterSettings, PlannerSettings, Settings, TracingSettings
from gearshift.testing.otlp_receiver import OtlpReceiver
from pydantic import SecretStr

pytestmark = pytest.mark.model

TOKEN = "tracing-test-token"
ASK = [{"role": "user", "content": "What is 17 * 23? Use python."}]
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_PARENT = "b7ad6b7169203331"


@pytest.fixture
def captured_logs():
    """Every log line the in-process services write meanwhile, as production's JSON handler writes
    it: INFO and up, and gearshift's own DEBUG lines (the executor's line per episode)."""
    stream, root, gearshift = io.StringIO(), logging.getLogger(), logging.getLogger("gearshift")
    handler, levels = logs.handler("json", stream), (root.level, gearshift.level)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    gearshift.setLevel(logging.DEBUG)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(levels[0])
        gearshift.setLevel(levels[1])


async def spans_of(receiver: OtlpReceiver, trace_id: str, services: set[str]) -> list:
    """The trace's spans once every service named has sent its spans (client spans end a moment
    after their call, and each service's exporter sends in batches)."""
    for _ in range(200):
        tracing.flush()
        spans = receiver.trace(trace_id)
        if services <= {span.service for span in spans}:
            await asyncio.sleep(0.2)  # the stragglers of the last batch
            tracing.flush()
            return receiver.trace(trace_id)
        await asyncio.sleep(0.05)
    return receiver.trace(trace_id)


async def test_one_episode_is_one_connected_trace_and_its_log_lines_carry_its_ids(postgres_url, tmp_path, captured_logs):
    with OtlpReceiver() as receiver:
        settings = Settings(
            data_dir=tmp_path, metrics_port=0, log_level="INFO", log_format="json", database_url=postgres_url, auth_token=SecretStr(TOKEN),
            executor=ExecutorSettings(max_tokens_per_turn=40, max_steps_agentic=1, max_steps_other=1),
            planner=PlannerSettings(max_tokens=32, max_horizon=1), learned_router=LearnedRouterSettings(poll_seconds=0.2),
            gateway=GatewaySettings(access_log=True),
            tracing=TracingSettings(enabled=True, otlp_endpoint=receiver.endpoint, sample_ratio=1.0),
        )
        async with embedded(settings, policy_model=weights.DEFAULT) as platform, httpx.AsyncClient(
            base_url=f"http://{platform.settings.gateway_addr}/v1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=600,
        ) as http:
            # A client's own trace context is continued, not replaced.
            given = await http.get("/models", headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"})
            assert given.status_code == 200
            captured_logs.truncate(0)
            captured_logs.seek(0)

            reply = await http.post("/chat/completions", json={"model": "gearshift-agentic", "messages": ASK})
            assert reply.status_code == 200, reply.text
            trajectory_id = reply.headers["x-gearshift-trajectory-id"]
            request_id = reply.headers["x-request-id"]
            lines = captured_logs.getvalue().splitlines()

            await asyncio.sleep(0.2)  # the request's span ends just after its last byte
            tracing.flush()
            root = next(span for span in receiver.spans if span.service == "gateway" and span.name == "POST /v1/chat/completions")
            spans = await spans_of(receiver, root.trace_id, {"gateway", "executor", "router", "planner", "sandbox", "store", "policy-server"})
            continued = await spans_of(receiver, CLIENT_TRACE, {"gateway"})
        tracing.flush()  # what the stopping platform still made, while the receiver listens

    assert [(span.name, span.parent_span_id) for span in continued] == [("GET /v1/models", CLIENT_PARENT)]

    services = {span.service for span in spans}
    assert {"gateway", "executor", "router", "planner", "sandbox", "store", "policy-server"} <= services
    assert [span for span in spans if not span.parent_span_id] == [root]
    ids = {span.span_id for span in spans}
    assert all(span.parent_span_id in ids for span in spans if span is not root), "a span whose parent is not in the trace"
    assert root.attributes["gearshift.trajectory_id"] == trajectory_id
    assert root.attributes["gearshift.mode"] == "MODE_AGENTIC" and root.attributes["gen_ai.usage.output_tokens"] > 0
    policy_calls = [span for span in spans if span.service != "policy-server" and span.name.startswith("policy ")]
    assert policy_calls and all(span.attributes["gen_ai.usage.input_tokens"] > 0 for span in policy_calls)
    served = {span.parent_span_id for span in spans if span.service == "policy-server"}
    assert all(call.span_id in served for call in policy_calls), "a policy call the policy server did not continue"
    solve = next(span for span in spans if span.service == "executor" and span.name.endswith("/Solve"))
    assert solve.attributes["gearshift.trajectory_id"] == trajectory_id and "gearshift.cost_usd" in solve.attributes
    assert any(span.service == "store" and span.name.endswith("/Put") for span in spans)

    parsed = [json.loads(line) for line in lines]  # every line is JSON
    episode = [line for line in parsed if line["logger"] != "httpx"]  # all but the test client's own
    assert {"gearshift.gateway.access", "gearshift.executor"} <= {line["logger"] for line in episode}, "the access log and the episode's line"
    ids = {(line["trace_id"], line["request_id"], line["trajectory_id"]) for line in episode}
    assert ids == {(root.trace_id, request_id, trajectory_id)}, episode
