"""helm test: asks each gearshift service's standard grpc.health.v1 service for its overall
status and exits non-zero unless every one answers SERVING.

Targets come as arguments, NAME=HOST:PORT. Runs in a gearshift service image (grpcio and
grpcio-health-checking are there); the health service needs no token.
"""

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING


def check(address: str, timeout: float) -> str:
    """The overall serving status of the service at address, or why it could not be had."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError as error:
            return f"DOWN ({error.code().name})"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: list[str]) -> int:
    timeout = float(argv[0])
    failed = 0
    for target in argv[1:]:
        name, _, address = target.partition("=")
        status = check(address, timeout)
        failed += status != "SERVING"
        print(f"{name:<10} {address:<48} {status}", flush=True)
    return 1 if failed or len(argv) < 2 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
