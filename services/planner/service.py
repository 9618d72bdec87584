"""Planner wiring."""

from __future__ import annotations

from gearshift.api.planner.v1 import planner_pb2, planner_pb2_grpc
from gearshift.policy_client import PolicyClient
from gearshift.server import Handler, Service
from gearshift.services.planner.core import SimulativePlanner
from gearshift.services.planner.servicer import PlannerServicer
from gearshift.settings import Settings

FULL_NAME = planner_pb2.DESCRIPTOR.services_by_name["Planner"].full_name


async def build(settings: Settings) -> Service:
    policy = PolicyClient.from_settings(settings)
    servicer = PlannerServicer(SimulativePlanner(policy, settings.planner), settings.limits)
    return Service(
        "planner",
        [Handler(planner_pb2_grpc.add_PlannerServicer_to_server, servicer, FULL_NAME)],
        on_close=[policy.aclose],
    )
