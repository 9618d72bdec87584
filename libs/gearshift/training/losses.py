"""Loss functions as small pure functions on tensors (after verl's core_algos): each can be read
and unit-tested alone against hand-computed values.

Shapes: per-token tensors are [B, T] (or any shape [...]) with a boolean mask of the same shape;
logits are [..., V].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of values where mask is set (0 when nothing is)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(token) under logits, per position: [..., V] and [...] -> [...]."""
    logits = logits.float()
    return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def cross_entropy(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean negative log-likelihood over the masked positions (SFT)."""
    return masked_mean(-token_logprobs(logits, tokens), mask)


def reverse_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, top_k: int | None = None) -> torch.Tensor:
    """Per-token KL(student || teacher) = sum_v p_s(v) (log p_s(v) - log p_t(v)): [..., V] -> [...].

    With top_k, both distributions are restricted to the student's k most likely tokens and
    renormalised there (alignment on the salient part of the vocabulary, as in Agents-A1)."""
    student, teacher = student_logits.float(), teacher_logits.float()
    if top_k is not None and top_k < student.shape[-1]:
        keep = student.topk(top_k, dim=-1).indices
        student, teacher = student.gather(-1, keep), teacher.gather(-1, keep)
    log_s = torch.log_softmax(student, dim=-1)
    log_t = torch.log_softmax(teacher, dim=-1)
    return (log_s.exp() * (log_s - log_t)).sum(-1)


def k3_kl(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Per-token unbiased, non-negative KL(policy || reference) estimate: r - log r - 1, r = p_ref / p."""
    log_ratio = logp_ref - logp
    return log_ratio.exp() - log_ratio - 1


@dataclass
class PolicyLoss:
    """The GRPO/APO loss and what it did."""

    loss: torch.Tensor
    clipped_low: float  # share of masked tokens whose ratio was clipped at 1 - eps_low (negative advantage)
    clipped_high: float  # share clipped at 1 + eps_high (positive advantage)
    mean_ratio: float
    kl: float


def group_mean(per_trajectory: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Mean over trajectories within each group, then over groups."""
    ids, index = torch.unique(groups, return_inverse=True)
    sums = torch.zeros(len(ids), dtype=per_trajectory.dtype).index_add(0, index, per_trajectory)
    counts = torch.zeros(len(ids), dtype=per_trajectory.dtype).index_add(0, index, torch.ones_like(per_trajectory))
    return (sums / counts).mean()


def policy_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    groups: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    kl_coef: float = 0.0,
    logp_ref: torch.Tensor | None = None,
) -> PolicyLoss:
    """Clipped policy-gradient loss with clip-higher (DAPO / SR2AM's GRPO).

    logp, logp_old, mask: [B, T]; advantages, groups: [B] (one advantage and group per
    trajectory). Per token: -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) (+ kl_coef * k3 KL
    to the reference); per trajectory: mean over its masked tokens; then mean within each
    group, then over groups."""
    mask = mask.bool()
    ratio = torch.exp(logp - logp_old)
    advantage = advantages.unsqueeze(-1).to(logp.dtype)
    unclipped = ratio * advantage
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high) * advantage
    per_token = -torch.minimum(unclipped, clipped)
    kl = torch.zeros_like(per_token)
    if kl_coef and logp_ref is not None:
        kl = k3_kl(logp, logp_ref)
        per_token = per_token + kl_coef * kl
    weights = mask.to(per_token.dtype)
    per_trajectory = (per_token * weights).sum(-1) / weights.sum(-1).clamp(min=1)
    loss = group_mean(per_trajectory, groups)
    with torch.no_grad():
        low = (ratio < 1 - eps_low) & (advantage < 0) & mask
        high = (ratio > 1 + eps_high) & (advantage > 0) & mask
        total = max(int(mask.sum()), 1)
        stats = dict(
            clipped_low=int(low.sum()) / total,
            clipped_high=int(high.sum()) / total,
            mean_ratio=float(masked_mean(ratio, mask)),
            kl=float(masked_mean(kl, mask)),
        )
    return PolicyLoss(loss=loss, **stats)
