"""Router wiring."""

from __future__ import annotations

from gearshift.api.router.v1 import router_pb2, router_pb2_grpc
from gearshift.policy_client import PolicyClient
from gearshift.server import Handler, Service
from gearshift.services.router.core import ModeRouter
from gearshift.services.router.learned import PublishedRouter, RouterReloader
from gearshift.services.router.servicer import RouterServicer
from gearshift.settings import Settings

FULL_NAME = router_pb2.DESCRIPTOR.services_by_name["Router"].full_name


async def build(settings: Settings) -> Service:
    policy = PolicyClient.from_settings(settings)
    on_close = [policy.aclose]
    learned = None
    if settings.learned_router.enabled:
        learned = PublishedRouter(settings.learned_router)
        reloader = RouterReloader(learned, settings)
        await reloader.start()
        on_close.append(reloader.close)
    servicer = RouterServicer(ModeRouter(policy, settings.router, learned), settings.limits)
    return Service(
        "router",
        [Handler(router_pb2_grpc.add_RouterServicer_to_server, servicer, FULL_NAME)],
        on_close=on_close,
    )
