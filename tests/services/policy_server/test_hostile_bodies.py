"""Bytes a client sends are never a 500: each hostile body (tests/services/hostile_bodies.py) is
a 4xx that says what is wrong, on every route that takes a body, over a real socket; and the
server keeps serving."""

from __future__ import annotations

import pytest

from tests.services.hostile_bodies import HOSTILE, Hostile, check, send


@pytest.mark.parametrize("case", HOSTILE, ids=lambda case: case.name)
async def test_a_hostile_body_is_a_4xx_that_says_what_is_wrong(http, policy_server, case: Hostile):
    tokenize = policy_server.base_url.removesuffix("/v1") + "/tokenize"  # served beside /v1, as vLLM does
    for route in ("/chat/completions", "/completions", tokenize) if case.any_route else ("/chat/completions",):
        check(await send(http, route, case), case)


async def test_the_server_serves_after_every_hostile_body(http):
    for case in HOSTILE:
        await send(http, "/chat/completions", case)
    reply = await http.post("/completions", json={"prompt": "hi", "max_tokens": 2})
    assert reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"] in ("length", "stop")


async def test_a_surrogate_pair_is_a_character_and_an_escaped_backslash_no_surrogate(http):
    # The lone-surrogate check must not refuse what is text: a pair (one emoji), or a backslash
    # followed by "ud800" (the letters, escaped).
    for content in (b'"\\ud83d\\ude00"', b'"\\\\ud800"'):
        body = b'{"prompt": ' + content + b', "max_tokens": 2}'
        reply = await http.post("/completions", content=body, headers={"content-type": "application/json"})
        assert reply.status_code == 200, reply.text
