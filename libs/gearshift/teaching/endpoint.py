"""An OpenAI-compatible endpoint whose "model" is a Python function of the request body.

Two users: the teachers that write training data by rule (gearshift.teaching.solvers), and the
ScriptedPolicy test stand-in (gearshift.testing.scripted_policy), which isolates the platform's
own logic from model time. Neither ever serves evaluation or users."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable

# request body -> the text the "model" writes, or an awaitable of it (a model that takes time,
# during which the endpoint serves other requests). On /v1/chat/completions it may instead write
# an assistant message as a dict, the way an engine's parsers return it (see ChatReply).
Responder = Callable[[dict], str | dict | Awaitable[str | dict]]


def _cut(text: str, stop: list[str]) -> str:
    """Applies stop words as an OpenAI server does: the text ends before the first one."""
    hits = [text.find(word) for word in stop if word and word in text]
    return text[: min(hits)] if hits else text


def _stand_in_ids(written: str, text: str, stop: list[str]) -> list[int]:
    """return_token_ids for a "model" without a tokenizer: one id per character (its code
    point) of the text up to and including the stop word that ended it, as a real server's ids
    run past the stop. Tests read back from them which text a kept span holds."""
    ended_by = next((word for word in stop if word and written.startswith(text + word)), "")
    return [ord(c) for c in text + ended_by]


def stand_in_render(body: dict) -> str:
    """What /tokenize renders of chat messages on a "model" without a chat template: ChatML,
    tool calls as JSON lines after the content, the last message left open when the request
    continues it (else, with add_generation_prompt, an assistant turn opened)."""
    messages = body.get("messages") or []
    continued = bool(body.get("continue_final_message"))
    text = ""
    for index, message in enumerate(messages):
        calls = "".join(f"\n{json.dumps(call.get('function', call))}" for call in message.get("tool_calls") or [])
        text += f"<|im_start|>{message['role']}\n{message.get('content') or ''}{calls}"
        text += "" if continued and index == len(messages) - 1 else "<|im_end|>\n"
    return text + ("<|im_start|>assistant\n" if body.get("add_generation_prompt", True) and not continued else "")


def _usage(body: dict, text: str) -> dict:
    prompt = body.get("prompt") or json.dumps(body.get("messages", []))
    usage = {"prompt_tokens": max(1, len(str(prompt)) // 4), "completion_tokens": max(1, len(text) // 4)}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return usage


class ChatReply:
    """An assistant message a responder wrote as a dict, answered as an engine with a reasoning
    parser and a tool-call parser answers (vLLM's --reasoning-parser, --tool-call-parser):

        {"content": "...", "reasoning_content": "...",
         "tool_calls": [{"name": "python", "arguments": {"code": "..."}, "id": "call_1"}]}

    every key optional; arguments an object, or a string sent verbatim (bad JSON included); ids
    call_<n> unless given. Stop words do not apply; finish_reason is "tool_calls" when it calls,
    else "stop", unless the dict names one (e.g. "length": a message cut by max_tokens).
    Streamed as reasoning, then content, then each call in two deltas (name, then its arguments
    in halves), as vLLM streams them."""

    def __init__(self, written: dict):
        self.content = written.get("content")
        self.reasoning = written.get("reasoning_content")
        self.calls = [
            {"id": call.get("id") or f"call_{n}", "type": "function",
             "function": {"name": call["name"], "arguments": _arguments_text(call.get("arguments", {}))}}
            for n, call in enumerate(written.get("tool_calls") or [], start=1)
        ]
        self.finish = written.get("finish_reason") or ("tool_calls" if self.calls else "stop")

    def text(self) -> str:
        """What the "model" wrote, for the usage and the stand-in token ids: its reasoning,
        content and calls, one after the other."""
        calls = "".join(f"{call['function']['name']}{call['function']['arguments']}" for call in self.calls)
        return (self.reasoning or "") + (self.content or "") + calls

    def message(self) -> dict:
        message = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        return message | ({"tool_calls": self.calls} if self.calls else {})

    def deltas(self) -> list[dict]:
        deltas = [{"reasoning_content": self.reasoning}] if self.reasoning else []
        deltas += [{"content": self.content}] if self.content else []
        for index, call in enumerate(self.calls):
            arguments = call["function"]["arguments"]
            half = len(arguments) // 2
            deltas.append({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                           "function": {"name": call["function"]["name"], "arguments": arguments[:half]}}]})
            deltas.append({"tool_calls": [{"index": index, "function": {"arguments": arguments[half:]}}]})
        return deltas


def _arguments_text(arguments) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _chat_reply(written: ChatReply, model: str, body: dict, stand_in_ids: bool) -> tuple[str, bytes]:
    text = written.text()
    usage = _usage(body, text)
    ids = {"token_ids": [ord(c) for c in text]} if stand_in_ids and body.get("return_token_ids") else {}
    if not body.get("stream"):
        choice = {"index": 0, "finish_reason": written.finish, "message": written.message()} | ids
        return "application/json", json.dumps({"id": "scripted", "model": model, "choices": [choice], "usage": usage}).encode()
    events = [{"choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in written.deltas()]
    events += [{"choices": [{"index": 0, "delta": {}, "finish_reason": written.finish} | ids]}, {"choices": [], "usage": usage}]
    return "text/event-stream", "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"


async def reply(respond: Responder, model: str, path: str, body: dict, stand_in_ids: bool = False) -> tuple[str, bytes]:
    """(content type, body) of the answer to one request; stand_in_ids: honour return_token_ids
    with _stand_in_ids (test stand-ins only: a trainer would take them for real tokens)."""
    if path.endswith("/models"):
        return "application/json", json.dumps({"object": "list", "data": [{"id": model, "object": "model"}]}).encode()
    if path.endswith("/health"):
        return "application/json", b'{"status": "ok"}'
    if path.endswith("/tokenize"):  # stand-in ids: one per character, as _stand_in_ids
        tokens = [ord(c) for c in (body["prompt"] if "prompt" in body else stand_in_render(body))]
        return "application/json", json.dumps({"tokens": tokens, "count": len(tokens)}).encode()
    if path.endswith("/detokenize"):
        return "application/json", json.dumps({"prompt": "".join(map(chr, body.get("tokens") or []))}).encode()
    chat = path.endswith("/chat/completions")
    stop = body.get("stop") or []
    written = respond(body)
    if inspect.isawaitable(written):
        written = await written
    if isinstance(written, dict):
        if not chat:
            raise ValueError("a responder writes a message (a dict) only on /v1/chat/completions")
        return _chat_reply(ChatReply(written), model, body, stand_in_ids)
    stop = [stop] if isinstance(stop, str) else stop
    text = _cut(written, stop)
    usage = _usage(body, text)
    ids = {"token_ids": _stand_in_ids(written, text, stop)} if stand_in_ids and body.get("return_token_ids") else {}
    if not body.get("stream"):
        choice = {"index": 0, "finish_reason": "stop"} | ids
        choice |= {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        return "application/json", json.dumps({"id": "scripted", "model": model, "choices": [choice], "usage": usage}).encode()
    piece = {"delta": {"content": text}} if chat else {"text": text}
    done = ({"delta": {}} if chat else {"text": ""}) | ids
    events = [
        {"choices": [{"index": 0, **piece, "finish_reason": None}]},
        {"choices": [{"index": 0, **done, "finish_reason": "stop"}]},
        {"choices": [], "usage": usage},
    ]
    return "text/event-stream", "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"


async def _serve_connection(respond: Responder, model: str, stand_in_ids: bool, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
    """A minimal HTTP/1.1 keep-alive loop: enough for httpx, and nearly free, so the stand-in
    adds as little as possible to what a benchmark measures."""
    try:
        while True:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            _, path, _ = head[0].split(" ", 2)
            headers = dict(line.lower().split(":", 1) for line in head[1:] if ":" in line)
            raw = await reader.readexactly(int(headers.get("content-length", "0").strip()))
            content_type, payload = await reply(respond, model, path, json.loads(raw) if raw else {}, stand_in_ids)
            writer.write(
                f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        pass  # the client hung up, or the server is shutting down
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def serve_function(respond: Responder, model: str = "scripted", stand_in_ids: bool = False, port: int = 0) -> AsyncIterator[str]:
    """Serves `respond` as a model on a free loopback port (or the port given); yields its base URL (…/v1)."""
    server = await asyncio.start_server(
        lambda reader, writer: _serve_connection(respond, model, stand_in_ids, reader, writer), "127.0.0.1", port
    )
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.close()
