"""The OpenAI HTTP surface the gateway and the policy server share: the status and error type of
each domain error (from its gRPC code), the error body, validation messages, server-sent events,
and the handlers on an app (driven in process: no sockets)."""

from __future__ import annotations

import inspect
import json
import logging

import grpc
import httpx
import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from gearshift import errors, openai_http
from gearshift.errors import GearshiftError, ResourceExhausted
from gearshift.http_server import ClientGone
from gearshift.openai_http import DONE, ApiError, error_body, error_response, error_then_done, sse, status_of, validation_message
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

log = logging.getLogger("tests.openai_http")

# Every domain error's status and OpenAI type. A new error class must be added here: its status
# is then a decision, not an accident.
DOMAIN_ERRORS = {
    "GearshiftError": (500, "server_error"),
    "InvalidArgument": (400, "invalid_request_error"),
    "FailedPrecondition": (400, "invalid_request_error"),
    "Unauthenticated": (401, "authentication_error"),
    "NotFound": (404, "not_found_error"),
    "AlreadyExists": (409, "conflict_error"),
    "ResourceExhausted": (429, "rate_limit_error"),
    "Unimplemented": (501, "server_error"),
    "Unavailable": (503, "server_error"),
    "DeadlineExceeded": (504, "server_error"),
}


def domain_error_classes() -> dict[str, type[GearshiftError]]:
    return {name: kind for name, kind in inspect.getmembers(errors, inspect.isclass) if issubclass(kind, GearshiftError)}


def test_every_domain_error_has_the_status_of_its_grpc_code_and_that_statuss_type():
    classes = domain_error_classes()
    assert set(classes) == set(DOMAIN_ERRORS)
    for name, kind in classes.items():
        status = status_of(kind("x"))
        assert (status, openai_http.error_type(status)) == DOMAIN_ERRORS[name], name
        assert status == openai_http.http_status(kind.code)


def test_a_services_own_error_class_takes_the_status_of_the_code_it_inherits():
    class QueueFull(ResourceExhausted):
        pass

    assert status_of(QueueFull("full")) == 429


@pytest.mark.parametrize("status, kind", [
    (400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"), (404, "not_found_error"),
    (405, "invalid_request_error"), (409, "conflict_error"), (413, "invalid_request_error"), (415, "invalid_request_error"),
    (422, "invalid_request_error"), (429, "rate_limit_error"), (500, "server_error"), (502, "server_error"), (503, "server_error"),
])
def test_each_status_has_openais_error_type(status, kind):
    assert openai_http.error_type(status) == kind


def test_the_error_body_has_openais_shape_and_its_code_is_the_status_unless_a_code_is_given():
    assert error_body(400, "bad", "n") == {"error": {"message": "bad", "type": "invalid_request_error", "param": "n", "code": 400}}
    assert error_body(404, "no such model", "model", "model_not_found")["error"]["code"] == "model_not_found"


def test_a_message_quoting_a_lone_surrogate_still_encodes():
    response = error_response(404, "the model gpt\ud800 does not exist")
    assert json.loads(response.body)["error"]["message"] == "the model gpt\\ud800 does not exist"  # the escape, as text


def test_a_429_or_503_says_when_to_retry():
    assert error_response(429, "busy").headers["retry-after"] == str(openai_http.RETRY_AFTER_SECONDS)
    assert error_response(503, "down").headers["retry-after"] == str(openai_http.RETRY_AFTER_SECONDS)
    assert error_response(429, "busy", retry_after=7).headers["retry-after"] == "7"
    assert "retry-after" not in error_response(400, "bad").headers


# validation messages


class Body(BaseModel):
    model: str
    n: int = 1
    messages: list[dict] = []


def invalid(data) -> RequestValidationError:
    with pytest.raises(ValidationError) as raised:
        Body.model_validate(data)
    return RequestValidationError([{**error, "loc": ("body", *error["loc"])} for error in raised.value.errors()])


def test_a_validation_message_names_each_field_and_the_param_is_the_first():
    message, param = validation_message(invalid({"n": "many", "messages": [1]}))
    assert param == "model"
    assert message.startswith("model: Field required; ") and "n: Input should be a valid integer" in message
    assert "messages.0: Input should be a valid dictionary" in message


def test_an_unsupported_field_is_named_by_its_own_message():
    error = PydanticCustomError("unsupported", "{message}", {"field": "top_k", "message": "top_k is not supported"})
    exc = RequestValidationError([{"type": error.type, "loc": ("body",), "msg": error.message(), "ctx": error.context}])
    assert validation_message(exc) == ("top_k is not supported", "top_k")


# server-sent events


def test_an_event_is_data_json_and_a_blank_line():
    assert sse({"a": 1}) == 'data: {"a": 1}\n\n'
    assert sse("[DONE]") == DONE == "data: [DONE]\n\n"


def test_a_failure_after_the_status_is_an_error_event_then_done():
    events = error_then_done(429, "busy").split("\n\n")[:-1]
    assert events == [f"data: {json.dumps(error_body(429, 'busy'))}", "data: [DONE]"]


async def events(fail: Exception | None) -> list[str]:
    """The events of a stream that sends one and then fails with fail, if given."""
    async def source():
        yield sse({"n": 1})
        if fail is not None:
            raise fail

    sent = "".join([chunk async for chunk in openai_http.ending_with_done(source(), log)])
    return [f"{event}\n\n" for event in sent.split("\n\n")[:-1]]


async def test_a_stream_ends_with_done():
    assert await events(None) == [sse({"n": 1}), DONE]


@pytest.mark.parametrize("failure, status, kind", [
    (ResourceExhausted("queue full"), 429, "rate_limit_error"),
    (ApiError(503, "executor: down"), 503, "server_error"),
    (errors.InvalidArgument("stop words"), 400, "invalid_request_error"),
])
async def test_a_stream_failing_reports_the_errors_status_and_type_then_done(failure, status, kind):
    sent = await events(failure)
    assert len(sent) == 3 and sent[0] == sse({"n": 1}) and sent[2] == DONE
    error = json.loads(sent[1].removeprefix("data: "))["error"]
    assert (error["code"], error["type"], error["message"]) == (status, kind, str(failure))


async def test_an_unexpected_stream_failure_is_logged_and_told_only_as_internal(caplog):
    with caplog.at_level(logging.ERROR, logger=log.name):
        sent = await events(RuntimeError("secret detail"))
    assert sent[1] == sse(error_body(500, "internal error")) and sent[2] == DONE
    assert "secret detail" in caplog.text


# the handlers on an app


def app_raising() -> FastAPI:
    app = FastAPI()
    openai_http.install(app, log)

    @app.post("/v1/things")
    async def things(body: Body) -> dict:
        failures = {"queue": ResourceExhausted("queue full"), "refused": ApiError(400, "no", "model"),
                    "gone": ClientGone(), "bug": RuntimeError("secret detail"), "missing": errors.NotFound("no such thing")}
        raise failures[body.model]

    return app


async def post(app: FastAPI, path: str, **kwargs) -> httpx.Response:
    transport = httpx.ASGITransport(app, raise_app_exceptions=False)  # an unexpected error's 500 is still sent
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        return await http.post(path, **kwargs)


@pytest.mark.parametrize("model, status, kind", [
    ("queue", 429, "rate_limit_error"), ("refused", 400, "invalid_request_error"), ("missing", 404, "not_found_error"),
    ("bug", 500, "server_error"),
])
async def test_the_handlers_answer_each_error_in_openais_shape(model, status, kind):
    reply = await post(app_raising(), "/v1/things", json={"model": model})
    assert reply.status_code == status and reply.json()["error"]["type"] == kind
    assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
    assert "secret detail" not in reply.text


async def test_a_client_gone_is_499_and_bodies_and_routes_are_checked():
    app = app_raising()
    assert (await post(app, "/v1/things", json={"model": "gone"})).status_code == openai_http.CLIENT_GONE
    invalid_body = await post(app, "/v1/things", json={"n": 1})
    assert invalid_body.status_code == 400 and invalid_body.json()["error"]["param"] == "model"
    assert (await post(app, "/v1/things", content=b"[]", headers={"content-type": "application/json"})).status_code == 400
    missing = await post(app, "/v1/nothing", json={})
    assert missing.status_code == 404 and missing.json()["error"]["message"] == "POST /v1/nothing is not a route of this server"
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        wrong_method = await http.get("/v1/things")
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"


def test_the_handlers_go_on_before_the_routes_that_read_bodies_strictly():
    app = FastAPI()

    @app.post("/v1/things")
    async def things(body: Body) -> dict:
        return {}

    with pytest.raises(RuntimeError, match="before the app's routes"):
        openai_http.install(app, log)


def test_the_gateways_and_the_policy_servers_queue_full_are_the_same_error():
    # The policy server's QueueFull is a ResourceExhausted; the gateway maps the executor's
    # RESOURCE_EXHAUSTED through the same table: one status, one type.
    assert openai_http.http_status(grpc.StatusCode.RESOURCE_EXHAUSTED) == status_of(ResourceExhausted("full")) == 429
