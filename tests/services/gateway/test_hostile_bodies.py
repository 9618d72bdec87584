"""Bytes a client sends are never a 500, and both OpenAI-compatible servers answer a fault alike:
each hostile body (tests/services/hostile_bodies.py) goes, as the same bytes over real sockets,
to the gateway of the embedded platform and to the platform's built-in policy server, and both
answer it with the same 4xx, the same error type and, where the body is refused before either
reads its fields, the same message."""

from __future__ import annotations

import logging

import httpx
import pytest

from tests.services.gateway.conftest import TOKEN
from tests.services.hostile_bodies import HOSTILE, Hostile, check, send

pytestmark = pytest.mark.model

AUTH = {"Authorization": f"Bearer {TOKEN}"}
SERVER_LOGGERS = ("gearshift.gateway", "gearshift.policy_server.http", "uvicorn.error")


@pytest.mark.parametrize("case", HOSTILE, ids=lambda case: case.name)
async def test_the_gateway_and_the_policy_server_answer_a_hostile_body_alike(served, case: Hostile, caplog):
    with caplog.at_level(logging.ERROR):
        async with httpx.AsyncClient(timeout=60) as http:
            gateway = check(await send(http, f"{served.base_url}/chat/completions", case, AUTH), case)
            policy = check(await send(http, f"{served.settings.policy_client.url}/chat/completions", case, AUTH), case)
    assert (gateway["code"], gateway["type"]) == (policy["code"], policy["type"])
    if case.any_route:
        assert gateway["message"] == policy["message"]
    assert not [record for record in caplog.records if record.name in SERVER_LOGGERS]  # no traceback either


async def test_the_gateway_serves_after_a_lone_surrogate(served):
    case = HOSTILE[0]
    async with httpx.AsyncClient(base_url=served.base_url, headers=AUTH, timeout=600) as http:
        check(await send(http, "/chat/completions", case), case)
        reply = await http.post("/chat/completions", json={"model": "gearshift-instant", "messages": [{"role": "user", "content": "Hi \U0001f600"}]})
    assert reply.status_code == 200, reply.text
