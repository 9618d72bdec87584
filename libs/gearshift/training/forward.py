"""Model forward passes that compute only what the loss needs.

The language-model head (hidden x vocabulary) is a large share of a small model's compute;
prompts and masked pieces need no logits, so the head runs on the target positions alone. And
every row of a batch starts with the same system prompt (two thirds of a short episode's
tokens): the decoder runs it once and the rows continue from its KV cache, broadcast over the
batch, in two halves by length, each padded only to its own longest row. That is the same
computation, gradients included (they flow back through the shared cache), done once instead of
once per row and without most of the padding.

TargetForward makes this forward the forward of one module, so that a DDP or FSDP wrapper around
it runs its hooks (gradient reduction, parameter gathering) around the whole computation."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gearshift.training.tokenization import Batch


@dataclass
class TargetLogits:
    """Logits at the positions that predict target tokens, flattened over the batch."""

    logits: torch.Tensor  # [N, V]
    tokens: torch.Tensor  # [N] the target tokens
    rows: torch.Tensor  # [N] which batch row each came from
    columns: torch.Tensor  # [N] the target token's position in its row

    def per_row(self, values: torch.Tensor, rows: int) -> list[torch.Tensor]:
        """Per-target values ([N], in this order: rows ascending) split into one tensor per row."""
        return list(values.split(torch.bincount(self.rows, minlength=rows).tolist()))


def _predicting(batch: Batch) -> torch.Tensor:
    """[B, T] mask of positions whose next token is a target."""
    mask = torch.zeros_like(batch.target_mask)
    mask[:, :-1] = batch.target_mask[:, 1:]
    return mask


# Decoding the prefix apart costs a second pass of every weight's gradient (measured on SmolLM2
# with 2 threads: about as much as 70 tokens' compute); below this many tokens saved, it loses.
MIN_TOKENS_SAVED = 128


def shared_prefix(batch: Batch) -> int:
    """How many leading tokens every row shares before any of them predicts a target (0 when
    sharing them saves fewer than MIN_TOKENS_SAVED); at least one token is always left to each row."""
    rows, width = batch.input_ids.shape
    if rows < 2 or width < 2:
        return 0
    same = (batch.input_ids == batch.input_ids[:1]).all(dim=0) & batch.attention_mask.bool().all(dim=0)
    length = int(same.long().cumprod(dim=0).sum())
    predicting = _predicting(batch).any(dim=0).nonzero()
    if len(predicting):
        length = min(length, int(predicting[0]))
    length = min(length, width - 1)
    return length if length * (rows - 1) >= MIN_TOKENS_SAVED else 0


def hidden_states(model: torch.nn.Module, batch: Batch, share_prefix: bool = True) -> torch.Tensor:
    """[B, T, H] last hidden states; the shared prefix is decoded once where share_prefix allows,
    except under activation checkpointing, whose recomputed layers take no cache."""
    decoder = model.get_decoder()
    checkpointing = model.training and getattr(decoder, "gradient_checkpointing", False)  # the flag every transformers sets
    shared = shared_prefix(batch) if share_prefix and not checkpointing else 0
    if not shared:
        return decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    rows, width = batch.input_ids.shape
    # Embedded once: two lookups would be two backward passes of the embedding, each writing a
    # dense vocabulary-sized gradient (the embedding is tied to the head).
    embeds = model.get_input_embeddings()(batch.input_ids)
    prefix = decoder(inputs_embeds=embeds[:1, :shared], use_cache=True)
    cache = prefix.past_key_values  # each half continues from its keys and values, broadcast over the half's rows
    prefix_kv = [(layer.keys, layer.values) for layer in cache.layers]
    lengths = batch.attention_mask.sum(dim=1).tolist()
    rest = embeds.new_zeros(rows, width - shared, embeds.shape[-1])
    for half in length_halves(lengths):
        end = max(shared + 1, *(lengths[row] for row in half))
        index = torch.tensor(half, device=embeds.device)
        half_cache = type(cache)([(keys.expand(len(half), -1, -1, -1), values.expand(len(half), -1, -1, -1)) for keys, values in prefix_kv])
        out = decoder(inputs_embeds=embeds[index, shared:end], attention_mask=batch.attention_mask[index, :end], cache=half_cache, use_cache=True)
        rest[index, : end - shared] = out.last_hidden_state  # past a half's longest row: padding, zero, predicting nothing
    return torch.cat([prefix.last_hidden_state.expand(rows, -1, -1), rest], dim=1)


def length_halves(lengths: list[int]) -> list[list[int]]:
    """The rows (two or more) by length, longest first, in two halves, each decoded padded only to
    its own longest row. Always two, whatever the lengths: FSDP gathers a layer's weights at each
    call of the layer, so every rank must call it as often (Run.micro_batches agrees on the
    prefix). More, smaller halves gained nothing more on the CPU."""
    order = sorted(range(len(lengths)), key=lambda row: -lengths[row])
    return [order[: len(order) // 2], order[len(order) // 2:]]


def target_logits(model: torch.nn.Module, batch: Batch, share_prefix: bool = True) -> TargetLogits:
    """Runs the decoder on the whole batch and the head on the target positions only."""
    hidden = hidden_states(model, batch, share_prefix)
    predicting = _predicting(batch)
    rows, columns = predicting.nonzero(as_tuple=True)
    logits = model.get_output_embeddings()(hidden[rows, columns])
    return TargetLogits(logits, batch.input_ids[rows, columns + 1], rows, columns + 1)


class TargetForward(torch.nn.Module):
    """A causal LM whose forward is target_logits: the module DDP and FSDP wrap (their hooks run
    only around a module's own forward, never around calls to its submodules)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, target_mask: torch.Tensor, share_prefix: bool = True) -> tuple:
        out = target_logits(self.model, Batch(input_ids, attention_mask, target_mask), share_prefix)
        return out.logits, out.tokens, out.rows, out.columns  # a tuple: FSDP finds the tensors of a tuple


def through(module: torch.nn.Module, batch: Batch, share_prefix: bool = True) -> TargetLogits:
    """target_logits through a TargetForward, or a DDP or FSDP wrapper of one."""
    return TargetLogits(*module(batch.input_ids, batch.attention_mask, batch.target_mask, share_prefix))
