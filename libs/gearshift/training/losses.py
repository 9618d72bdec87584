"""Loss functions as small pure functions on tensors (after verl's core_algos): each can be read
and unit-tested alone against hand-computed values.

Per-token tensors are flat, [N], over the target tokens of a batch (forward.Targets);
logits are [..., V]: a chunk of tokens' at a time (forward.Head), never the whole batch's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(token) under logits, per position: [..., V] and [...] -> [...]."""
    logits = logits.float()
    return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the distribution logits give, per position: [..., V] -> [...]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


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


def mismatch_kl(logp_behaviour: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(sampler || trainer) on the sampler's tokens (NaN where its
    log-probability was not kept), in float64: at the 1e-6 differences of two float32 kernels,
    r - log r - 1 cancels to 0 in float32."""
    return k3_kl(logp_behaviour.double(), logp.double())


def importance_weights(logp_proximal: torch.Tensor, logp_behaviour: torch.Tensor, cap: float,
                       band: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token weight of a token sampled by another policy than the proximal one (an older
    step's weights, or vLLM's kernels for the same weights): rho = p_proximal / p_behaviour,
    truncated at cap, and 0 where rho leaves band (masked: too far off-policy to correct; IcePop's
    mask for an MoE's routing mismatch). A NaN behaviour (not kept) weighs 1. Returns
    (weights, masked), both [N] and without gradient."""
    rho = torch.exp((logp_proximal - logp_behaviour).detach()).nan_to_num(nan=1.0)
    masked = (rho < band[0]) | (rho > band[1])
    return torch.where(masked, 0.0, rho.clamp(max=cap)), masked


@dataclass
class PolicyLoss:
    """The GRPO/APO loss of some tokens, and counts that add up over micro-batches and ranks."""

    loss: torch.Tensor  # the weighted sum over these tokens (their share of the step's loss)
    tokens: int
    clipped_low: int  # tokens whose ratio was clipped at 1 - eps_low (negative advantage)
    clipped_high: int  # tokens clipped at 1 + eps_high (positive advantage)
    ratio_sum: float
    kl_sum: float
    dual_clipped: int = 0  # negative-advantage tokens whose loss the dual clip bounded
    behaviour_tokens: int = 0  # tokens with the sampler's log-probability
    masked: int = 0  # of those, tokens whose importance ratio left the band
    truncated: int = 0  # tokens whose importance weight was cut to the cap
    mismatch_kl_sum: float = 0.0  # k3 estimate of KL(sampler || proximal) summed over behaviour_tokens


def trajectory_weights(target_counts: torch.Tensor, groups: torch.Tensor, total_groups: int | None = None) -> torch.Tensor:
    """[B] weight of each token of trajectory i, so that the weighted sum of per-token losses is
    the mean over groups of the mean over each group's trajectories of a trajectory's token mean:
    1 / (T_i * n_g * G), with T_i its target tokens, n_g its group's size and G the step's groups
    (total_groups where other ranks hold some; default: these)."""
    ids, index, sizes = torch.unique(groups, return_inverse=True, return_counts=True)
    return 1.0 / (target_counts.clamp(min=1).double() * sizes[index] * (total_groups or len(ids)))


def policy_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    kl_coef: float = 0.0,
    logp_ref: torch.Tensor | None = None,
    logp_behaviour: torch.Tensor | None = None,
    dual_clip: float = 0.0,
    importance_cap: float = 2.0,
    mask_band: tuple[float, float] = (0.2, 5.0),
) -> PolicyLoss:
    """Clipped policy-gradient loss with clip-higher (DAPO / SR2AM's GRPO) over target tokens,
    decoupled from the policy that sampled them (AReaL's decoupled PPO) and dual-clipped.

    Every argument is per token, [N]: logp, logp_old (the proximal policy: the weights before this
    step's updates), logp_ref and logp_behaviour (the sampler's, NaN where not kept), the advantage
    of the token's trajectory and its weight (trajectory_weights). Per token:
    w * -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), r = p / p_old, bounded by dual_clip * |A|
    where A < 0 (Ye et al. 2020: a stale token with a large ratio gets no unbounded push), w the
    importance weight of the proximal policy over the sampler's (importance_weights; 1 without
    logp_behaviour), + kl_coef * k3 KL to the reference; the loss is their weighted sum."""
    ratio = torch.exp(logp - logp_old)
    advantage = advantages.to(logp.dtype)
    per_token = -torch.minimum(ratio * advantage, ratio.clamp(1 - eps_low, 1 + eps_high) * advantage)
    none = torch.zeros_like(per_token, dtype=torch.bool)
    dual, masked, kept, importance = none, none, none, torch.ones_like(per_token)
    if dual_clip:
        dual = (advantage < 0) & (per_token > -dual_clip * advantage)
        per_token = torch.where(dual, -dual_clip * advantage, per_token)
    if logp_behaviour is not None:
        importance, masked = importance_weights(logp_old, logp_behaviour.to(logp.dtype), importance_cap, mask_band)
        kept = ~torch.isnan(logp_behaviour)
        per_token = per_token * importance
    kl = torch.zeros_like(per_token)
    if kl_coef and logp_ref is not None:
        kl = k3_kl(logp, logp_ref)
        per_token = per_token + kl_coef * kl
    loss = (per_token * weights.to(per_token.dtype)).sum()
    with torch.no_grad():
        return PolicyLoss(
            loss=loss,
            tokens=len(logp),
            clipped_low=int(((ratio < 1 - eps_low) & (advantage < 0)).sum()),
            clipped_high=int(((ratio > 1 + eps_high) & (advantage > 0)).sum()),
            ratio_sum=float(ratio.sum()),
            kl_sum=float(kl.sum()),
            dual_clipped=int(dual.sum()),
            behaviour_tokens=int(kept.sum()),
            masked=int(masked.sum()),
            truncated=int((kept & ~masked & (importance >= importance_cap)).sum()),
            mismatch_kl_sum=float(mismatch_kl(logp_behaviour, logp_old)[kept].sum()) if logp_behaviour is not None else 0.0,
        )
