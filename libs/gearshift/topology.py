"""The platform's services, one row each. Ports, start and stop order, address settings, health
checks, the CLI's choices and the embedded platform are all derived from this table: adding a
service is one row here plus its package under services/ (docs/adding-a-service.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Each protocol's bootstrap: a module whose running(service, settings) and main(build) run the
# service that the package's build(settings) returns (gearshift serve, up and embedded use them).
BOOTSTRAPS = {"grpc": "gearshift.server", "http": "gearshift.http_server"}


@dataclass(frozen=True)
class ServiceSpec:
    """One service of the platform."""

    name: str  # its package under services/ and its name on the command line
    port: int  # where it listens on one machine; in Kubernetes every pod uses its own
    title: str  # what it is, for help texts
    # grpc: grpc.health.v1, metrics on port + 1000. http: GET /ready for health, /metrics on
    # its own port (the OpenAI-compatible gateway, for clients outside the platform).
    protocol: Literal["grpc", "http"] = "grpc"

    @property
    def bootstrap(self) -> str:
        """The module that runs it (gearshift.server for gRPC, gearshift.http_server for HTTP)."""
        return BOOTSTRAPS[self.protocol]

    @property
    def address_setting(self) -> str:
        """The Settings field (GEARSHIFT_<NAME>_ADDR) where its clients find it."""
        return f"{self.name}_addr"

    @property
    def module(self) -> str:
        """The module whose build(settings) makes the service (gearshift serve NAME runs it)."""
        return f"gearshift.services.{self.name}.service"


# In start order: what the others call comes up first (and stops last).
SERVICES = (
    ServiceSpec("store", 50056, "Trajectory store"),
    ServiceSpec("sandbox", 50054, "Tool sandbox"),
    ServiceSpec("reward", 50055, "Reward service"),
    ServiceSpec("planner", 50052, "SR2AM planner"),
    ServiceSpec("router", 50051, "Mode router"),
    ServiceSpec("executor", 50053, "Episode executor"),
    ServiceSpec("gateway", 8100, "OpenAI-compatible gateway", protocol="http"),
)
SERVICE_NAMES = tuple(service.name for service in SERVICES)
GRPC_SERVICE_NAMES = tuple(service.name for service in SERVICES if service.protocol == "grpc")
BY_NAME = {service.name: service for service in SERVICES}
METRICS_PORT_OFFSET = 1000  # a gRPC service's port + 1000 serves /metrics unless set explicitly
POLICY_PORT = 8400  # the built-in policy server's HTTP port on one machine
