"""One generation's token choice and text: sampling parameters, picking the next token, and the
text that token by token is streamed, cut at stop words and held back while it may still turn
out to be the start of one. No model calls here: the scheduler decodes many generations at once
and hands each of them its logits."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

REPLACEMENT_CHAR = "\ufffd"  # what decode() yields for half of a multi-byte character


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop. temperature 0 means greedy."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    frequency_penalty: float = 0.0  # OpenAI's: per time a token was generated, off its logit
    presence_penalty: float = 0.0  # OpenAI's: once a token was generated, off its logit
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none kept; k: each sampled token's log-probability and the k likeliest


@dataclass
class TokenLogprob:
    """A sampled token's log-probability under the model (before temperature and top_p, as
    vLLM's default raw_logprobs), and the `top` likeliest tokens' (id, log-probability), best first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Delta:
    """Text that became safe to send, and the log-probabilities of the tokens sampled since the
    previous delta (when asked for; a token whose text is held back comes with a later delta,
    or with the result)."""

    text: str
    logprobs: list[TokenLogprob] | None = None


@dataclass
class GenerationResult:
    """The finished generation: finish_reason is "stop" or "length"."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    token_ids: list[int] = field(default_factory=list)  # the sampled tokens (a stop word's included)
    logprobs: list[TokenLogprob] | None = None  # one per token_ids entry, when asked for


def token_logprob(logits: torch.Tensor, token: int, top: int) -> TokenLogprob:
    """The log-probability of token under logits, and of the `top` likeliest tokens."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    best = torch.topk(logprobs, top) if top else None
    pairs = list(zip(best.indices.tolist(), best.values.tolist())) if best is not None else []
    return TokenLogprob(token, float(logprobs[token]), pairs)


def penalised(logits: torch.Tensor, params: SamplingParams, generated: list[int]) -> torch.Tensor:
    """logits less the frequency and presence penalties of the tokens generated so far (the
    output's, not the prompt's, as OpenAI and vLLM count them): what breaks a greedy loop."""
    if not (params.frequency_penalty or params.presence_penalty) or not generated:
        return logits
    tokens, counts = torch.tensor(generated).unique(return_counts=True)
    logits = logits.float().clone()
    logits[tokens] -= params.frequency_penalty * counts + params.presence_penalty
    return logits


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


class OutputText:
    """The text of one generation as its tokens arrive.

    add(token) returns the piece of text that is now safe to send: text that might be the start
    of a stop word, or half of a multi-byte character, is held back until it is not."""

    def __init__(self, tokenizer, params: SamplingParams, stop_token_ids: set[int]):
        self.tokenizer = tokenizer
        self.params = params
        self.stop_token_ids = set() if params.ignore_eos else stop_token_ids
        self.hold = max((len(stop) for stop in params.stop), default=1) - 1
        self.tokens: list[int] = []  # generated tokens that are part of the output
        self.text = ""
        self.sent = 0  # characters of text already handed out
        self.finish_reason: str | None = None  # set once the generation is over

    def add(self, token: int) -> str:
        if token in self.stop_token_ids:
            self.finish_reason = "stop"
            return self.rest()
        self.tokens.append(token)
        self.text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        cut = _first_stop(self.text, self.params.stop, max(0, self.sent - self.hold)) if self.params.stop else None
        if cut is not None:
            self.text, self.finish_reason = self.text[:cut], "stop"
            return self.rest()
        if len(self.tokens) >= self.params.max_tokens:
            self.finish_reason = "length"
            return self.rest()
        ready = len(self.text) - self.hold
        if self.text.endswith(REPLACEMENT_CHAR):
            ready = min(ready, len(self.text) - 1)
        return self._send(ready)

    def rest(self) -> str:
        """Everything not sent yet (the generation is over: nothing is held back any more)."""
        return self._send(len(self.text))

    def _send(self, upto: int) -> str:
        if upto <= self.sent:
            return ""
        piece, self.sent = self.text[self.sent : upto], upto
        return piece
