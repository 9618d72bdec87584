"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, as the policy
server writes them (code: the HTTP status, as vLLM), and the HTTP status of each gRPC status the
platform's services answer with."""

from __future__ import annotations

import grpc
from fastapi.responses import JSONResponse

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}
RETRY_AFTER_SECONDS = 1  # on 429 and 503: the openai client waits this long before its retry

# The canonical HTTP mapping of gRPC codes (google.rpc.Code). UNAUTHENTICATED and PERMISSION_DENIED
# from a service are the gateway's own credentials failing, not the client's: a 500.
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
# Statuses whose gRPC details are the caller's business (what was wrong, what is down); for the
# rest the reply says only which service failed and the request id, and the gateway logs it.
SHOWN = {400, 404, 409, 429, 501, 503, 504}


class ApiError(Exception):
    """A request the gateway answers with an OpenAI-shaped error."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status in (429, 503) else None
    return JSONResponse(error_body(status, message, param), status, headers)


def from_rpc(exc: grpc.aio.AioRpcError, service: str, request_id: str) -> ApiError:
    """The ApiError for a failed call to a platform service."""
    status = HTTP_STATUS.get(exc.code(), 500)
    if status in SHOWN:
        return ApiError(status, f"{service}: {exc.details() or exc.code().name}")
    return ApiError(status, f"{service} failed ({exc.code().name}; request id {request_id})")
