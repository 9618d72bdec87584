"""How the gateway answers a failed call to a platform service. The OpenAI error surface itself
(error body, status table, handlers) is gearshift.openai_http's, shared with the policy server."""

from __future__ import annotations

import grpc
from gearshift.openai_http import ApiError, http_status

# UNAUTHENTICATED and PERMISSION_DENIED from a service are the gateway's own credentials failing,
# not the client's: a 500.
OWN_CREDENTIALS = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
# Statuses whose gRPC details are the caller's business (what was wrong, what is down); for the
# rest the reply says only which service failed and the request id, and the gateway logs it.
SHOWN = {400, 404, 409, 429, 501, 503, 504}


def from_rpc(exc: grpc.aio.AioRpcError, service: str, request_id: str) -> ApiError:
    """The ApiError for a failed call to a platform service."""
    status = 500 if exc.code() in OWN_CREDENTIALS else http_status(exc.code())
    if status in SHOWN:
        return ApiError(status, f"{service}: {exc.details() or exc.code().name}")
    return ApiError(status, f"{service} failed ({exc.code().name}; request id {request_id})")
