"""The gateway's HTTP routes: OpenAI's chat completions and models, feedback, health, readiness
and metrics. Every error is an OpenAI-shaped error object (gearshift.openai_http), never a crash."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from gearshift import openai_http, tracing
from gearshift.api.executor.v1 import executor_pb2_grpc
from gearshift.services.gateway import translate
from gearshift.services.gateway.admission import Admission
from gearshift.services.gateway.api_keys import ANONYMOUS_KEY_NAME, ApiKeys
from gearshift.services.gateway.completions import Completion
from gearshift.services.gateway.feedback import FeedbackDesk
from gearshift.services.gateway.middleware import AccessLog, BearerAuth, BodyLimit, GatewayMetrics, Metrics, RequestIds
from gearshift.services.gateway.schemas import ChatCompletionRequest, FeedbackRequest
from gearshift.settings import Settings
from grpc_health.v1 import health_pb2, health_pb2_grpc

log = logging.getLogger("gearshift.gateway")
TRAJECTORY_HEADER = "x-gearshift-trajectory-id"


@dataclass
class Gateway:
    """What the routes call: the executor, its health, and the feedback desk."""

    settings: Settings
    executor: executor_pb2_grpc.ExecutorStub
    executor_health: health_pb2_grpc.HealthStub
    feedback: FeedbackDesk
    keys: ApiKeys


def create_app(gateway: Gateway, metrics: GatewayMetrics | None = None):
    """The gateway's ASGI application: the routes inside metrics, auth, admission control and the body limit. The
    metrics' registry is served on a port of its own (HttpService.metrics_registry), not here."""
    settings, config = gateway.settings, gateway.settings.gateway
    metrics = metrics or GatewayMetrics()
    app = FastAPI(title="gearshift gateway", docs_url=None, redoc_url=None, openapi_url=None)
    started = int(time.time())
    native = settings.policy_client.protocol == "native"  # how the executor streams the policy's text

    openai_http.install(app, log)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        try:
            reply = await gateway.executor_health.Check(health_pb2.HealthCheckRequest(), timeout=config.ready_timeout_seconds)
            state = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        except grpc.aio.AioRpcError as exc:
            state = f"DOWN ({exc.code().name})"
        serving = state == "SERVING"
        return JSONResponse({"status": "ready" if serving else "unavailable", "executor": state}, 200 if serving else 503)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [_card(model, started) for model in translate.MODELS.values()]}

    @app.get("/v1/models/{name}")
    async def model(name: str) -> dict:
        return _card(translate.served_model(name), started)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        request.state.model = body.model if body.model in translate.MODELS else "unknown"
        # A stream names its trajectory in its headers, before the episode has stored it, so its id
        # is chosen here; a whole reply takes the executor's, which spares the executor the store
        # look-up a client-chosen id costs (an idempotent retry check).
        trajectory_id = translate.new_trajectory_id() if body.stream else ""
        if trajectory_id:
            tracing.bind_trajectory(trajectory_id)
        solve = translate.solve_request(body, trajectory_id, settings.store.max_label_chars, _caller(request))
        view = translate.EpisodeView(trajectory_id, time.monotonic(), translate.stop_words(body), native)
        call = gateway.executor.Solve(solve, timeout=config.request_timeout_seconds)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        completion = Completion(call, view, body.model, int(time.time()), include_usage, metrics)
        if body.stream:
            return completion.stream(await completion.first_event(request), {TRAJECTORY_HEADER: trajectory_id})
        whole = await completion.whole(request)
        return JSONResponse(whole, headers={TRAJECTORY_HEADER: whole["gearshift"]["trajectory_id"]})

    @app.post("/v1/feedback")
    async def feedback(body: FeedbackRequest, request: Request) -> dict:
        return await gateway.feedback.submit(body, _caller(request))

    admitted = Admission(BodyLimit(app, config.max_body_bytes), config.key_policy, lambda reason: metrics.refused.labels(reason).inc())
    inner = BearerAuth(admitted, gateway.keys)
    return Metrics(RequestIds(AccessLog(inner) if config.access_log else inner), metrics)


def _caller(request: Request) -> str:
    """The name of the caller's API key (BearerAuth set it); `anonymous` where the gateway needs none."""
    return getattr(request.state, "api_key", "") or ANONYMOUS_KEY_NAME


def _card(model: translate.ServedModel, created: int) -> dict:
    return {"id": model.name, "object": "model", "created": created, "owned_by": "gearshift", "description": model.description}
