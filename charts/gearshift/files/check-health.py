"""helm test: asks each gearshift service whether it serves and exits non-zero unless every one
answers SERVING: a gRPC service's standard grpc.health.v1 service (its overall status), an HTTP
service's GET /ready (200: SERVING, 503: NOT_SERVING).

Targets come as arguments, NAME=HOST:PORT for gRPC, NAME=http(s)://HOST:PORT/PATH for HTTP. Runs
in a gearshift service image (grpcio and grpcio-health-checking are there); health checks need
no token. With GEARSHIFT_TLS__ENABLED=true (tls.enabled: the pod's GEARSHIFT_TLS__* settings) it
speaks TLS as the platform's clients do: the servers' certificates checked against
GEARSHIFT_TLS__CA_FILE for GEARSHIFT_TLS__SERVER_NAME (else the host dialed), its own certificate
presented to servers that ask for one.
"""

import http.client
import os
import socket
import ssl
import sys
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

HTTP_STATES = {200: "SERVING", 503: "NOT_SERVING"}


def tls_setting(name: str) -> str:
    return os.environ.get(f"GEARSHIFT_TLS__{name}", "")


def tls_enabled() -> bool:
    return tls_setting("ENABLED").lower() in ("1", "true", "yes", "on")


def read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def grpc_channel(address: str) -> grpc.Channel:
    if not tls_enabled():
        return grpc.insecure_channel(address)
    credentials = grpc.ssl_channel_credentials(
        read(tls_setting("CA_FILE")), read(tls_setting("KEY_FILE")), read(tls_setting("CERT_FILE")))
    options = [("grpc.ssl_target_name_override", tls_setting("SERVER_NAME"))] if tls_setting("SERVER_NAME") else []
    return grpc.secure_channel(address, credentials, options=options)


class TLSConnection(http.client.HTTPSConnection):
    """HTTPS that checks the server's certificate for GEARSHIFT_TLS__SERVER_NAME, not the host dialed."""

    def connect(self):
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=tls_setting("SERVER_NAME") or self.host)


def check(address: str, timeout: float) -> str:
    """The overall serving status of the service at address, or why it could not be had."""
    if address.startswith("http://"):
        return check_http(address, timeout)
    if address.startswith("https://"):
        return check_https(address, timeout)
    with grpc_channel(address) as channel:
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


def check_https(url: str, timeout: float) -> str:
    context = ssl.create_default_context(cafile=tls_setting("CA_FILE") or None)
    if tls_setting("CERT_FILE"):
        context.load_cert_chain(tls_setting("CERT_FILE"), tls_setting("KEY_FILE"))
    parts = urlsplit(url)
    connection = TLSConnection(parts.hostname, parts.port or 443, timeout=timeout, context=context)
    try:
        connection.request("GET", parts.path or "/")
        status = connection.getresponse().status
    except OSError as error:  # refused, unresolvable, timed out, a certificate refused
        return f"DOWN ({type(error).__name__})"
    finally:
        connection.close()
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
