"""Gateway wiring: channels to the executor, store and reward service, the app, what to close."""

from __future__ import annotations

from gearshift.api.executor.v1 import executor_pb2_grpc
from gearshift.api.reward.v1 import reward_pb2_grpc
from gearshift.api.store.v1 import store_pb2_grpc
from gearshift.clients import service_channel
from gearshift.http_server import HttpService
from gearshift.services.gateway.api_keys import ApiKeys
from gearshift.services.gateway.app import Gateway, create_app
from gearshift.services.gateway.feedback import FeedbackDesk
from gearshift.services.gateway.middleware import GatewayMetrics, trace_trust
from gearshift.settings import Settings
from grpc_health.v1 import health_pb2_grpc

CALL_TIMEOUT_SECONDS = 30.0  # a store or reward call of the feedback route


async def build(settings: Settings) -> HttpService:
    channels = {name: service_channel(name, settings) for name in ("executor", "store", "reward")}
    feedback = FeedbackDesk(
        store=store_pb2_grpc.TrajectoryStoreStub(channels["store"]),
        reward=reward_pb2_grpc.RewardStub(channels["reward"]),
        correct_at=settings.gateway.feedback_correct_at,
        max_answer_chars=settings.limits.max_answer_chars,
        timeout_seconds=CALL_TIMEOUT_SECONDS,
    )
    gateway = Gateway(
        settings=settings,
        executor=executor_pb2_grpc.ExecutorStub(channels["executor"]),
        executor_health=health_pb2_grpc.HealthStub(channels["executor"]),
        feedback=feedback,
        keys=ApiKeys(settings.gateway.api_keys_file, settings.token(), settings.gateway.accept_platform_token),
    )
    gateway.keys.refresh()  # a broken keys file is logged at start

    async def close() -> None:
        for channel in channels.values():
            await channel.close()

    metrics = GatewayMetrics()
    return HttpService("gateway", create_app(gateway, metrics), on_close=[close], host=settings.gateway.host, port=settings.gateway.port,
                       metrics_registry=metrics.registry, metrics_port=settings.gateway.metrics_port,
                       limit_concurrency=settings.gateway.max_concurrency or None, trusts_trace=trace_trust(gateway.keys, settings.gateway),
                       auth=f"{gateway.keys.describe()}, platform token {'set' if settings.auth_token else 'unset'}")
