"""The model calls of the scheduler: prefill (prompts, after whatever prefix the prefix cache
supplied each), decode (one token for every row of a batch) and verify (a lone row's token and a
draft after it). All run the hand-written Llama forward where the model was prepared for it,
transformers' forward otherwise.
Synchronous torch code; the scheduler thread calls it."""

from __future__ import annotations

import inspect
import weakref
from functools import cache

import torch
from gearshift.services.policy_server.batch_cache import BatchCache, RowKV
from gearshift.services.policy_server.llama_decoder import LlamaDecoder, supports

_decoders: weakref.WeakKeyDictionary[torch.nn.Module, LlamaDecoder] = weakref.WeakKeyDictionary()


@cache
def _cache_argument(model_class: type) -> str:
    """transformers 5 renamed forward's past_key_values to cache."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def empty_row(model: torch.nn.Module) -> RowKV:
    """A row with no tokens, shaped like the model's KV cache."""
    config = model.config.get_text_config(decoder=True)
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dtype = next(model.parameters()).dtype
    empty = torch.zeros((1, heads, 0, head_dim), dtype=dtype)
    return [(empty, empty) for _ in range(config.num_hidden_layers)]


def _forward(
    model: torch.nn.Module, cache: BatchCache, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
    keep: int = 1,
) -> torch.Tensor:
    """Runs the model over input_ids [rows, new] after the cache's columns; returns the logits
    of the last `keep` positions [rows, keep, vocab] (see LlamaDecoder.forward for the arguments)."""
    if decoder := _decoders.get(model):
        return decoder.forward(cache, input_ids, positions, mask, keep)
    cache.reserve(input_ids.shape[1])
    inputs = {"attention_mask": mask, "position_ids": positions, "use_cache": True, _cache_argument(type(model)): cache.for_forward()}
    logits = model(input_ids=input_ids, logits_to_keep=keep, **inputs).logits
    cache.advance(input_ids.shape[1])
    return logits


def prefill(model: torch.nn.Module, prompt_ids: list[int], prefix: RowKV | None, reserve: int) -> tuple[torch.Tensor, BatchCache]:
    """Computes the prompt's KV cache after the cached prefix (the first len(prefix) tokens of
    prompt_ids, already computed); returns the last prompt position's logits and a one-row cache
    with `reserve` free columns for the tokens to come."""
    start = prefix[0][0].shape[-2] if prefix else 0
    remaining = len(prompt_ids) - start
    cache = BatchCache.of_rows([prefix or empty_row(model)], headroom=remaining + reserve)
    positions = torch.arange(start, len(prompt_ids))[None]
    # No mask: each token sees the prefix and the prompt before it. The hand-written forward
    # attends to the two apart; transformers builds that mask from the cache's length.
    logits = _forward(model, cache, torch.tensor([prompt_ids[start:]]), positions, None)
    return logits[0, -1], cache


def prefill_together(
    model: torch.nn.Module, prompts: list[list[int]], prefixes: list[RowKV | None], reserves: list[int]
) -> list[tuple[torch.Tensor, BatchCache]]:
    """prefill() of several prompts in one forward: their weights are read once, not once each.

    Cached prefixes sit right-aligned before column `width`; each prompt's remaining tokens are
    fed left-padded to the longest, so a row's prefix and its new tokens are apart by its padding.
    The mask lets a token see its row's prefix and the row's earlier tokens (a padding token sees
    itself, so that no attention row is empty); each row is then copied out without the gap."""
    if len(prompts) == 1:
        return [prefill(model, prompts[0], prefixes[0], reserves[0])]
    cached = [prefix[0][0].shape[-2] if prefix else 0 for prefix in prefixes]
    new = [len(prompt) - start for prompt, start in zip(prompts, cached)]
    cache = BatchCache.of_rows([prefix or empty_row(model) for prefix in prefixes], headroom=max(new))
    width, columns = cache.width, max(new)
    input_ids = torch.zeros((len(prompts), columns), dtype=torch.long)
    positions = torch.zeros((len(prompts), columns), dtype=torch.long)
    mask = torch.zeros((len(prompts), 1, columns, width + columns), dtype=torch.bool)
    causal = torch.ones(columns, columns, dtype=torch.bool).tril()
    for row, (prompt, start, count) in enumerate(zip(prompts, cached, new)):
        pad = columns - count
        input_ids[row, pad:] = torch.tensor(prompt[start:])
        positions[row, pad:] = torch.arange(start, len(prompt))
        mask[row, 0, :, width - start : width] = True
        mask[row, 0, :, width + pad :] = causal[:, pad:]
        mask[row, 0, torch.arange(pad), torch.arange(width, width + pad)] = True
    logits = _forward(model, cache, input_ids, positions, mask)
    rows = []
    for row, (start, count, reserve) in enumerate(zip(cached, new, reserves)):
        prefix_columns, new_columns = slice(width - start, width), slice(width + columns - count, width + columns)
        kept = [
            tuple(torch.cat((part[row : row + 1, :, prefix_columns], part[row : row + 1, :, new_columns]), -2) for part in layer)
            for layer in cache.buffers
        ]
        rows.append((logits[row, -1], BatchCache.of_rows([kept], headroom=reserve)))
    return rows


def prepare(model: torch.nn.Module) -> None:
    """Builds the model's hand-written forward, which takes over its weights: only for weights
    the server loaded itself (a trainer's module must keep its parameters), and never while a
    forward runs. A prepared model runs only through prefill and decode here; an unprepared one
    runs transformers' forward."""
    if model not in _decoders and supports(model):
        _decoders[model] = LlamaDecoder(model)


def decode(model: torch.nn.Module, cache: BatchCache, tokens: list[int]) -> torch.Tensor:
    """One step: feeds each row its next token; returns logits [rows, vocab]."""
    return _forward(model, cache, torch.tensor(tokens)[:, None], cache.positions(), cache.decode_mask())[:, -1]


def verify(model: torch.nn.Module, cache: BatchCache, tokens: list[int]) -> torch.Tensor:
    """One step of a one-row cache fed several tokens: its next one and a draft after it (see
    speculation.py). Returns the logits after each of them [len(tokens), vocab]."""
    (length,), width, new = cache.lengths, cache.width, len(tokens)
    mask = torch.ones(new, width + new, dtype=torch.bool).tril(width)  # the row's columns, then causal
    mask[:, : width - length] = False  # padding, where the row was in a longer batch
    positions = torch.arange(length, length + new)[None]
    return _forward(model, cache, torch.tensor([tokens]), positions, mask[None, None], keep=new)[0]
