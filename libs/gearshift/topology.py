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
    # What it calls (services, and "policy" for the policy server): `gearshift up` stops a
    # service only once everything that calls it has stopped, so no call in flight loses its callee.
    calls: tuple[str, ...] = ()

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


POLICY = "policy"  # the policy server: what the services call, not a service of the table

# In start order: what the others call comes up first (`calls` orders the stop: callers first).
SERVICES = (
    ServiceSpec("store", 50056, "Trajectory store"),
    ServiceSpec("sandbox", 50054, "Tool sandbox", calls=(POLICY,)),
    ServiceSpec("reward", 50055, "Reward service", calls=(POLICY,)),
    ServiceSpec("planner", 50052, "SR2AM planner", calls=(POLICY,)),
    ServiceSpec("router", 50051, "Mode router", calls=("store", POLICY)),
    ServiceSpec("executor", 50053, "Episode executor", calls=("router", "planner", "sandbox", "reward", "store", POLICY)),
    ServiceSpec("gateway", 8100, "OpenAI-compatible gateway", protocol="http", calls=("executor", "store", "reward", POLICY)),
)
SERVICE_NAMES = tuple(service.name for service in SERVICES)
GRPC_SERVICE_NAMES = tuple(service.name for service in SERVICES if service.protocol == "grpc")
BY_NAME = {service.name: service for service in SERVICES}
METRICS_PORT_OFFSET = 1000  # a gRPC service's port + 1000 serves /metrics unless set explicitly
POLICY_PORT = 8400  # the built-in policy server's HTTP port on one machine

# One port order for every layout: the default one's (router 50051 ... store 50056, the gateway,
# the policy server), which `gearshift up --base-port B` keeps on B, B+1, ...
PORT_ORDER = (*sorted(GRPC_SERVICE_NAMES, key=lambda name: BY_NAME[name].port),
              *(service.name for service in SERVICES if service.protocol != "grpc"), POLICY)


def ports(base_port: int | None = None, policy_port: int = POLICY_PORT) -> dict[str, int]:
    """Each service's port (and the policy server's, as "policy") in PORT_ORDER: the default
    layout, or consecutive ports from base_port."""
    if base_port:
        return {name: base_port + offset for offset, name in enumerate(PORT_ORDER)}
    return {spec.name: spec.port for spec in SERVICES} | {POLICY: policy_port}


def describe_base_port() -> str:
    """--base-port B's layout in words: "router B, planner B+1, ..."."""
    return ", ".join(f"{name} B+{offset}" if offset else f"{name} B" for offset, name in enumerate(PORT_ORDER))
