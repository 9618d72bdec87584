"""Advantage estimators as small pure functions."""

from __future__ import annotations

import torch


def group_zscore(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO's advantage: (r - mean of its group) / (std of its group + eps).

    The std is the sample standard deviation (n - 1, as GRPO and TRL compute it); a group of
    one, or one whose rewards are all equal, gets advantage 0 (nothing to learn from it)."""
    rewards = rewards.float()
    advantages = torch.zeros_like(rewards)
    for group in torch.unique(groups):
        members = groups == group
        values = rewards[members]
        if values.numel() < 2 or bool((values == values[0]).all()):
            continue
        advantages[members] = (values - values.mean()) / (values.std() + eps)
    return advantages
