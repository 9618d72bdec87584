"""Model forward passes that compute the vocabulary projection only where the loss needs it.

The language-model head (hidden x vocabulary) is a large share of a small model's compute;
prompts and masked pieces need no logits, so the head runs on the target positions alone."""

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


def _predicting(batch: Batch) -> torch.Tensor:
    """[B, T] mask of positions whose next token is a target."""
    mask = torch.zeros_like(batch.target_mask)
    mask[:, :-1] = batch.target_mask[:, 1:]
    return mask


def target_logits(model: torch.nn.Module, batch: Batch) -> TargetLogits:
    """Runs the decoder on the whole batch and the head on the target positions only."""
    hidden = model.get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    predicting = _predicting(batch)
    rows, columns = predicting.nonzero(as_tuple=True)
    logits = model.get_output_embeddings()(hidden[rows, columns])
    return TargetLogits(logits, batch.input_ids[rows, columns + 1], rows, columns + 1)


def dense(values: torch.Tensor, where: TargetLogits, shape: torch.Size) -> torch.Tensor:
    """Scatters per-target values back to a [B, T] tensor (zeros elsewhere)."""
    out = torch.zeros(shape, dtype=values.dtype)
    return out.index_put((where.rows, where.columns), values)
