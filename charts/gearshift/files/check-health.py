"""helm test: asks each gearshift service whether it serves and exits non-zero unless every one
answers SERVING: a gRPC service's standard grpc.health.v1 service (its overall status), an HTTP
service's GET /ready (200: SERVING, 503: NOT_SERVING).

Targets come as arguments, NAME=HOST:PORT for gRPC, NAME=http://HOST:PORT/PATH for HTTP. Runs
in a gearshift service image (grpcio and grpcio-health-checking are there); health checks need
no token.
"""

import sys
import urllib.error
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

HTTP_STATES = {200: "SERVING", 503: "NOT_SERVING"}


def check(address: str, timeout: float) -> str:
    """The overall serving status of the service at address, or why it could not be had."""
    if address.startswith("http://"):
        return check_http(address, timeout)
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError as error:
            return f"DOWN ({error.code().name})"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def check_http(url: str, timeout: float) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            status = reply.status
    except urllib.error.HTTPError as error:  # 4xx and 5xx come as errors
        status = error.code
    except OSError as error:  # refused, unresolvable, timed out
        return f"DOWN ({type(getattr(error, 'reason', error)).__name__})"
    return HTTP_STATES.get(status, f"DOWN ({status})")


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
