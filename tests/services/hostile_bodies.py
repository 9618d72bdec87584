"""Request bodies a client may send that no OpenAI client would, each with the status and a
piece of the message both OpenAI-compatible servers (the gateway and the built-in policy server)
must answer it with: a 4xx that says what is wrong, never a 500. The same bytes go to both, so
one server's answer can be compared with the other's."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

ASK = b'"model": "gearshift", "messages": [{"role": "user", "content": "hi"}]'
JSON = "application/json"


@dataclass(frozen=True)
class Hostile:
    name: str
    body: bytes
    status: int
    hint: str  # a piece of the error message
    content_type: str | None = JSON
    any_route: bool = True  # refused before the route's own fields are read; else as a chat completion


def _nested(levels: int) -> bytes:
    return b"{" + ASK + b', "tool_choice": ' + b"[" * levels + b"]" * levels + b"}"


HOSTILE = [
    # A lone surrogate escape is valid JSON syntax but no text: protobuf and tokenizers cannot encode it.
    Hostile("lone surrogate", b'{"model": "gearshift", "messages": [{"role": "user", "content": "\\ud800"}]}', 400,
            "messages.0.content holds \\ud800"),
    Hostile("lone low surrogate in the model", b'{"model": "gpt\\udc00", "messages": [{"role": "user", "content": "hi"}]}', 400,
            "model holds \\udc00"),
    Hostile("invalid UTF-8", b'{"model": "gearshift", "messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, "not UTF-8"),
    Hostile("UTF-16", ("{" + ASK.decode() + "}").encode("utf-16"), 400, "not UTF-8"),
    Hostile("nested past the parser", _nested(5000), 400, "nested deeper than"),
    Hostile("nested past the limit", _nested(200), 400, "tool_choice is nested deeper than"),
    Hostile("integer of 5000 digits", b"{" + ASK + b', "max_tokens": 1' + b"0" * 5000 + b"}", 400, "does not fit in 64 bits"),
    Hostile("integer beyond int64", b"{" + ASK + b', "seed": 9223372036854775808}', 400, "does not fit in 64 bits"),
    Hostile("float beyond a double", b"{" + ASK + b', "temperature": 1e400}', 400, "beyond the range of a double"),
    Hostile("NaN", b"{" + ASK + b', "temperature": NaN}', 400, "NaN is not a JSON number"),
    Hostile("-Infinity", b"{" + ASK + b', "presence_penalty": -Infinity}', 400, "-Infinity is not a JSON number"),
    Hostile("messages of the wrong type", b'{"model": "gearshift", "messages": "hi"}', 400, "messages: Input should be a valid list",
            any_route=False),
    Hostile("stream of the wrong type", b"{" + ASK + b', "stream": [true]}', 400, "stream: Input should be a valid boolean",
            any_route=False),
    Hostile("an array", b"[1, 2]", 400, "must be a JSON object, not an array"),
    Hostile("null", b"null", 400, "must be a JSON object, not null"),
    Hostile("a number", b"42", 400, "must be a JSON object, not a number"),
    Hostile("truncated JSON", b"{" + ASK, 400, "invalid JSON body"),
    Hostile("empty", b"", 400, "body is empty"),
    Hostile("empty without a content type", b"", 400, "body is empty", None),
    Hostile("text/plain", b"{" + ASK + b"}", 415, "content-type: application/json, not text/plain", "text/plain"),
    Hostile("form encoded", b"{" + ASK + b"}", 415, "not application/x-www-form-urlencoded", "application/x-www-form-urlencoded"),
    Hostile("no content type", b"{" + ASK + b"}", 415, "the request has none", None),
]


async def send(http: httpx.AsyncClient, path: str, case: Hostile, headers: dict | None = None) -> httpx.Response:
    """Posts the case's bytes as they are (httpx adds no content type to raw content)."""
    sent = dict(headers or {}) | ({"content-type": case.content_type} if case.content_type else {})
    return await http.post(path, content=case.body, headers=sent)


def check(reply: httpx.Response, case: Hostile) -> dict:
    """The error of a reply that answered the case as it must; fails with the reply otherwise."""
    assert reply.status_code == case.status, f"{case.name}: {reply.status_code} {reply.text[:300]}"
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error", error
    assert case.hint in error["message"], error["message"]
    return error
