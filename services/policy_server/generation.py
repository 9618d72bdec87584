"""One generation on one model: a plain decoding loop over the KV cache, so that text can be
streamed token by token, stop words cut the text exactly, and a cancelled request stops at the
next token. Synchronous; the engine runs it on its generation thread."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from gearshift.weights import LoadedModel

REPLACEMENT_CHAR = "\ufffd"  # what decode() yields for half of a multi-byte character


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop. temperature 0 means greedy."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False


@dataclass
class GenerationResult:
    """The finished generation: finish_reason is "stop", "length" or "cancelled"."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


def pick_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Greedy at temperature 0, otherwise nucleus sampling at the given temperature."""
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= params.top_p  # keeps the top token
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


def _first_stop(text: str, stops: list[str], start: int) -> int | None:
    found = [index for stop in stops if (index := text.find(stop, start)) >= 0]
    return min(found) if found else None


def _forward_for(model: torch.nn.Module) -> Callable:
    """model(ids, cache) -> (logits, cache) across transformers versions: 5.x renamed
    past_key_values to cache; only the last position's logits are computed where supported."""
    parameters = inspect.signature(model.forward).parameters
    name = "cache" if "cache" in parameters else "past_key_values"
    extra = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}

    def forward(input_ids: torch.Tensor, cache: object) -> tuple[torch.Tensor, object]:
        output = model(input_ids=input_ids, use_cache=True, **{name: cache}, **extra)
        return output.logits, getattr(output, name)

    return forward


def generate(
    loaded: LoadedModel,
    prompt_ids: list[int],
    params: SamplingParams,
    emit: Callable[[str], None],
    cancelled: Callable[[], bool],
) -> GenerationResult:
    """Generates up to params.max_tokens tokens after prompt_ids, calling emit with each new
    piece of text. Text that might be the start of a stop word is held back until it is not."""
    generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
    stop_ids = set() if params.ignore_eos else loaded.stop_token_ids
    hold = max((len(stop) for stop in params.stop), default=1) - 1
    generated: list[int] = []
    text, sent, finish = "", 0, "length"
    input_ids = torch.tensor([prompt_ids])
    forward = _forward_for(loaded.model)
    past = None
    with torch.inference_mode():
        for _ in range(params.max_tokens):
            if cancelled():
                finish = "cancelled"
                break
            logits, past = forward(input_ids, past)
            token = pick_token(logits[0, -1], params, generator)
            if token in stop_ids:
                finish = "stop"
                break
            generated.append(token)
            text = loaded.tokenizer.decode(generated, skip_special_tokens=True)
            cut = _first_stop(text, params.stop, max(0, sent - hold)) if params.stop else None
            if cut is not None:
                text, finish = text[:cut], "stop"
                break
            ready = len(text) - hold
            if text.endswith(REPLACEMENT_CHAR):
                ready = min(ready, len(text) - 1)
            if ready > sent:
                emit(text[sent:ready])
                sent = ready
            input_ids = torch.tensor([[token]])
    if len(text) > sent and finish != "cancelled":
        emit(text[sent:])
    return GenerationResult(text, finish, len(prompt_ids), len(generated))
