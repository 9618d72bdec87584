"""OpenAI's HTTP surface, one for every service that speaks it (the gateway, the built-in policy
server): the error body `{"error": {"message", "type", "param", "code"}}`, the status and type of
each fault, the message of a body that does not validate, server-sent events, bodies read as
strict JSON, and the exception handlers that put all of it on a FastAPI app. Held once, so that
the two servers answer the same fault with the same status and type."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from email.message import Message

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from gearshift.errors import GearshiftError
from gearshift.http_server import ClientGone
from gearshift.interceptors import request_id
from gearshift.strict_json import json_kind, read_json

# OpenAI's error type of each status; other 4xx are invalid_request_error, 5xx server_error.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}
# The canonical HTTP status of each gRPC code (google.rpc.Code); the rest (INTERNAL, UNKNOWN,
# DATA_LOSS) are 500. A GearshiftError's status is its code's.
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
RETRY_AFTER_SECONDS = 1  # on 429 and 503 unless the error says: the openai client waits this long before its retry
CLIENT_GONE = 499  # nginx's "client closed request"; nobody reads it
DONE = "data: [DONE]\n\n"


class ApiError(Exception):
    """A request answered with an OpenAI-shaped error of the given status."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def http_status(code: grpc.StatusCode) -> int:
    return HTTP_STATUS.get(code, 500)


def status_of(error: GearshiftError) -> int:
    """The HTTP status of a domain error: that of its gRPC code."""
    return http_status(error.code)


def error_body(status: int, message: str, param: str | None = None, code: str | int | None = None) -> dict:
    """OpenAI's error body; code is the status unless a more precise one is known ("model_not_found")."""
    # A message may quote what the client sent: whatever it holds, the reply must encode as UTF-8.
    shown = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"error": {"message": shown, "type": error_type(status), "param": param, "code": status if code is None else code}}


def error_response(
    status: int, message: str, param: str | None = None, code: str | int | None = None,
    retry_after: int | None = None, headers: dict | None = None,
) -> JSONResponse:
    if retry_after is None and status in (429, 503):
        retry_after = RETRY_AFTER_SECONDS
    if retry_after is not None:
        headers = {**(headers or {}), "Retry-After": str(retry_after)}
    return JSONResponse(error_body(status, message, param, code), status, headers)


def domain_error_fields(error: GearshiftError) -> tuple[int, str, str | None, str | int | None]:
    """A domain error's status, message, param and code: an error may name its param and a more
    precise code than its status ("model_not_found")."""
    return status_of(error), str(error), getattr(error, "param", None), getattr(error, "error_code", None)


def internal_error_message() -> str:
    rid = request_id.get()
    return "internal error" if rid == "-" else f"internal error (request id {rid})"


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """The message of a request that did not validate, and the field it names first."""
    parts, param = [], None
    for error in exc.errors():
        if error.get("type") == "json_invalid":
            return f"invalid JSON body: {error.get('ctx', {}).get('error', error.get('msg'))}", None
        if error.get("type") == "unsupported":  # a field the server cannot honour: its message names it
            param = param or error["ctx"]["field"]
            parts.append(error["msg"])
            continue
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        param = param or where or None
        parts.append(f"{where or 'body'}: {error.get('msg')}")
    return "; ".join(parts) or "invalid request", param


# Server-sent events


def sse(payload: dict | str) -> str:
    """One event: `data: {json}` and a blank line."""
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def error_then_done(status: int, message: str, param: str | None = None, code: str | int | None = None) -> str:
    """How a stream already answered 200 reports a failure: an error event, then [DONE]."""
    return sse(error_body(status, message, param, code)) + DONE


async def ending_with_done(events: AsyncIterator[str], log: logging.Logger) -> AsyncIterator[str]:
    """The events, then [DONE]. Once streaming has begun the status is sent: a failure becomes
    an error event, its status that of the error (500 with a generic message when unexpected)."""
    try:
        async for event in events:
            yield event
    except ApiError as exc:
        yield error_then_done(exc.status, exc.message, exc.param)
    except GearshiftError as exc:
        yield error_then_done(*domain_error_fields(exc))
    except Exception:
        log.exception("stream failed (request %s)", request_id.get())
        yield error_then_done(500, internal_error_message())
    else:
        yield DONE


# Request bodies


class JsonBodyRoute(APIRoute):
    """A route whose body, when it takes one, must be a JSON object sent as application/json and
    is read by strict_json.read_json: whatever bytes a client sends are a 4xx that says what is
    wrong, never a failure deeper in (a lone surrogate that protobuf cannot encode, an integer
    beyond int64)."""

    def get_route_handler(self):
        handle = super().get_route_handler()
        if self.body_field is None:
            return handle

        async def checked(request: Request) -> Response:
            request = _StrictJsonRequest(request.scope, request.receive)
            await _check_body(request)
            return await handle(request)

        return checked


class _StrictJsonRequest(Request):
    async def json(self):
        if not hasattr(self, "_json"):
            self._json = read_json(await self.body())
        return self._json


async def _check_body(request: Request) -> None:
    try:
        body = await request.body()
    except ClientDisconnect:
        raise ClientGone() from None
    if not body.strip():
        raise ApiError(400, "the request body is empty: send a JSON object")
    content_type = request.headers.get("content-type")
    if not _is_json(content_type):
        sent = f"not {content_type}" if content_type else "and the request has none"
        raise ApiError(415, f"the body must be JSON, with content-type: application/json, {sent}")
    try:
        value = await request.json()
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"invalid JSON body: {exc.msg}") from None
    if not isinstance(value, dict):
        raise ApiError(400, f"the body must be a JSON object, not {json_kind(value)}")


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    message = Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


# Exception handlers


def _unknown_route(request: Request, status: int) -> str:
    where = f"{request.method} {request.url.path}"
    return f"{where}: method not allowed" if status == 405 else f"{where} is not a route of this server"


def install(app: FastAPI, log: logging.Logger, route_missing: Callable[[Request, int], str] = _unknown_route) -> None:
    """Reads the bodies of the app's routes as strict JSON and answers every error in OpenAI's
    shape. Call it before adding routes (they take the route class then). route_missing: the
    message of a path that is no route (404) or a method it does not take (405)."""
    if any(isinstance(route, APIRoute) for route in app.router.routes):
        raise RuntimeError("openai_http.install must come before the app's routes")
    app.router.route_class = JsonBodyRoute

    @app.exception_handler(ApiError)
    async def refused(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param)

    @app.exception_handler(GearshiftError)
    async def domain_error(request: Request, exc: GearshiftError) -> JSONResponse:
        return error_response(*domain_error_fields(exc), retry_after=getattr(exc, "retry_after_seconds", None))

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return error_response(400, message, param)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        missing = exc.status_code in (404, 405)
        message = route_missing(request, exc.status_code) if missing else str(exc.detail)
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=CLIENT_GONE)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s (request %s)", request.url.path, request_id.get())
        return error_response(500, internal_error_message())
