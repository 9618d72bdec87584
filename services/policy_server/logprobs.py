"""Sampled tokens' log-probabilities in OpenAI's two shapes: chat completions'
`logprobs.content[] = {token, logprob, bytes, top_logprobs}` and completions' parallel lists
`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`.

A token's text is its own bytes decoded on their own, so a token holding half of a multi-byte
character reads as U+FFFD while its `bytes` are the real ones (OpenAI's convention: join the
bytes of consecutive tokens to rebuild the character)."""

from __future__ import annotations

import weakref
from functools import cache

from gearshift.services.policy_server.generation import TokenLogprob

_byte_level: weakref.WeakKeyDictionary[object, bool] = weakref.WeakKeyDictionary()


@cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet read back, the character each byte is written as -> the byte:
    printable Latin-1 bytes stand for themselves, the other 68 for chr(256), chr(257), ..."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [byte for byte in range(256) if byte not in printable]
    return {chr(byte): byte for byte in printable} | {chr(256 + n): byte for n, byte in enumerate(others)}


def _is_byte_level(tokenizer) -> bool:
    """Whether the tokenizer writes tokens in GPT-2's byte-level alphabet (SmolLM2, Llama 3, Qwen)."""
    if tokenizer not in _byte_level:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        _byte_level[tokenizer] = backend is not None and "ByteLevel" in str(backend.decoder)
    return _byte_level[tokenizer]


def token_bytes(tokenizer, token_id: int) -> bytes:
    """The bytes a token stands for."""
    if _is_byte_level(tokenizer):
        piece = tokenizer.convert_ids_to_tokens(token_id)
        decoder = _byte_decoder()
        if piece is not None and all(char in decoder for char in piece):
            return bytes(decoder[char] for char in piece)
    return tokenizer.decode([token_id]).encode()


def token_text(tokenizer, token_id: int) -> str:
    return token_bytes(tokenizer, token_id).decode("utf-8", errors="replace")


def chat_content(tokenizer, entries: list[TokenLogprob]) -> list[dict]:
    """chat.completion's `logprobs.content`: one entry per sampled token."""

    def entry(token_id: int, logprob: float) -> dict:
        raw = token_bytes(tokenizer, token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}

    return [entry(e.token_id, e.logprob) | {"top_logprobs": [entry(i, lp) for i, lp in e.top]} for e in entries]


def completion_logprobs(tokenizer, entries: list[TokenLogprob], offset: int = 0) -> dict:
    """text_completion's `logprobs`; `text_offset` counts characters from offset (the text sent
    before, when streamed). A position's alternatives whose texts coincide keep the likeliest."""
    tokens = [token_text(tokenizer, e.token_id) for e in entries]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    top = []
    for e in entries:
        alternatives: dict[str, float] = {}
        for token_id, logprob in e.top:
            alternatives.setdefault(token_text(tokenizer, token_id), logprob)
        top.append(alternatives)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries], "top_logprobs": top, "text_offset": offsets}
