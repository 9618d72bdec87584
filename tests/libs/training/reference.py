"""The reference the chunked head is checked against: the whole model's forward, its logits over
the whole vocabulary at every target position, as the training code computed them before Head."""

from __future__ import annotations

import torch
from gearshift.training import forward, losses
from gearshift.training.tokenization import Batch


def target_logits(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """([N, V] logits, [N] tokens) at the positions that predict target tokens, rows ascending."""
    rows, columns = forward.target_positions(batch)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return logits[rows, columns], batch.input_ids[rows, columns + 1]


def target_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    logits, tokens = target_logits(model, batch)
    return losses.token_logprobs(logits, tokens)
