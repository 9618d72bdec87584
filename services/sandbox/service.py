"""Sandbox wiring."""

from __future__ import annotations

from gearshift.api.sandbox.v1 import sandbox_pb2, sandbox_pb2_grpc
from gearshift.server import Handler, Service
from gearshift.services.sandbox.core import Sandbox
from gearshift.services.sandbox.servicer import SandboxServicer
from gearshift.settings import Settings

FULL_NAME = sandbox_pb2.DESCRIPTOR.services_by_name["Sandbox"].full_name


async def build(settings: Settings) -> Service:
    sandbox = await Sandbox.create(settings)
    servicer = SandboxServicer(sandbox, settings.sandbox.advertise_address or f"{settings.host}:{settings.service_port('sandbox')}")
    return Service("sandbox", [Handler(sandbox_pb2_grpc.add_SandboxServicer_to_server, servicer, FULL_NAME)], on_close=[sandbox.close])
