"""How the gateway answers a failed call to a platform service. The OpenAI error surface itself
(error body, status table, handlers) is gearshift.openai_http's, shared with the policy server."""

from __future__ import annotations

import logging

import grpc
from gearshift.openai_http import ApiError, http_status

log = logging.getLogger("gearshift.gateway")

# UNAUTHENTICATED and PERMISSION_DENIED from a service are the gateway's own credentials failing,
# not the client's: a 500.
OWN_CREDENTIALS = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
# A 5xx says only what kind of failure it was and the request id: gRPC's details of a failure on
# the platform's side name its insides (ipv4:10.0.3.7:50051, store-headless.<ns>.svc), so they go
# to the log. A 4xx is the client's business (what was wrong with the request) and shows them.
FAILED = {503: "is unavailable; retry later", 504: "did not answer in time"}


def from_rpc(exc: grpc.aio.AioRpcError, service: str, request_id: str) -> ApiError:
    """The ApiError for a failed call to a platform service."""
    status = 500 if exc.code() in OWN_CREDENTIALS else http_status(exc.code())
    if status < 500:
        return ApiError(status, f"{service}: {exc.details() or exc.code().name}")
    log.warning("%s call failed (request %s): %s: %s", service, request_id, exc.code().name, exc.details())
    return ApiError(status, f"{service} {FAILED.get(status, 'failed')} (request id {request_id})")
