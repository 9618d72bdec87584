"""Loss functions against values computed by hand."""

import math

import pytest
import torch
from gearshift.training import losses


def test_token_logprobs():
    logits = torch.log(torch.tensor([[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]]))
    logp = losses.token_logprobs(logits, torch.tensor([0, 1, 1]))
    assert logp.tolist() == pytest.approx([math.log(0.5), math.log(0.75), math.log(0.1)], rel=1e-6)


def test_reverse_kl_full_vocabulary():
    student = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    teacher = torch.log(torch.tensor([0.25, 0.5, 0.25]))
    expected = 0.5 * math.log(2) + 0.25 * math.log(0.5)  # sum p_s log(p_s / p_t)
    assert losses.reverse_kl(student, teacher).item() == pytest.approx(expected, rel=1e-6)
    assert losses.reverse_kl(student, student).item() == pytest.approx(0.0, abs=1e-7)


def test_reverse_kl_top_k_renormalises_on_the_students_top_tokens():
    student = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    teacher = torch.log(torch.tensor([0.2, 0.2, 0.6]))
    # top-2 of the student: tokens 0 and 1; renormalised: s = (2/3, 1/3), t = (1/2, 1/2)
    expected = (2 / 3) * math.log((2 / 3) / 0.5) + (1 / 3) * math.log((1 / 3) / 0.5)
    assert losses.reverse_kl(student, teacher, top_k=2).item() == pytest.approx(expected, rel=1e-6)


def test_k3_kl():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert losses.k3_kl(logp, ref).item() == pytest.approx(0.5 - math.log(0.5) - 1, rel=1e-6)


def weighted(logp, logp_old, advantages, targets, groups, **extra):
    """policy_loss over flat tokens; advantages, target counts and groups per trajectory."""
    weights = losses.trajectory_weights(torch.tensor(targets), torch.tensor(groups))
    owner = torch.repeat_interleave(torch.arange(len(targets)), torch.tensor(targets))
    return losses.policy_loss(logp, logp_old, torch.tensor(advantages)[owner], weights[owner], **extra)


def test_policy_loss_clips_high_for_positive_and_low_for_negative_advantages():
    # Trajectory 0 (A = +1): ratios 1.5 (clipped to 1.28) and 1.0. Trajectory 1 (A = -1): ratios
    # 0.5 (clipped to 0.8, -min(-0.5, -0.8) = 0.8) and 1.1 (unclipped: 1.1). One group.
    ratios = torch.tensor([1.5, 1.0, 0.5, 1.1])
    result = weighted(torch.log(ratios), torch.zeros(4), [1.0, -1.0], [2, 2], [0, 0])
    row0 = -(1.28 + 1.0) / 2
    row1 = (0.8 + 1.1) / 2
    assert result.loss.item() == pytest.approx((row0 + row1) / 2, rel=1e-6)
    assert (result.tokens, result.clipped_high, result.clipped_low) == (4, 1, 1)


def test_policy_loss_unclipped_side_keeps_the_ratio():
    # A = +1 with ratio 0.5: min(0.5, clip(0.5)=0.8) = 0.5, so the loss is -0.5 (no clipping below for A > 0).
    result = weighted(torch.log(torch.tensor([0.5])), torch.zeros(1), [1.0], [1], [0])
    assert result.loss.item() == pytest.approx(-0.5, rel=1e-6)
    assert result.clipped_low == 0 and result.clipped_high == 0


def test_policy_loss_token_mean_per_trajectory_then_group_mean():
    # Ratio 1 everywhere: per-token loss = -A. Group 0: trajectories of 1 and 3 tokens, A = 2 and 4:
    # per-trajectory means -2 and -4 -> group mean -3 (a token mean over the group would give -3.5).
    # Group 1: one trajectory of 2 tokens, A = 1 -> -1. Loss = mean(-3, -1) = -2.
    zeros = torch.zeros(6)
    assert weighted(zeros, zeros, [2.0, 4.0, 1.0], [1, 3, 2], [0, 0, 1]).loss.item() == pytest.approx(-2.0, rel=1e-6)


def test_trajectory_weights_of_a_share_of_the_groups_use_the_global_count():
    # A rank holding group 0 of a step's 2 groups: 1 / (T_i * |g| * 2), not * 1.
    weights = losses.trajectory_weights(torch.tensor([1, 3]), torch.tensor([0, 0]), total_groups=2)
    assert weights.tolist() == pytest.approx([1 / (1 * 2 * 2), 1 / (3 * 2 * 2)])


def test_policy_loss_adds_weighted_kl_to_the_reference():
    logp = torch.full((1,), math.log(0.5))
    ref = torch.full((1,), math.log(0.25))
    result = weighted(logp, logp, [0.0], [1], [0], kl_coef=0.1, logp_ref=ref)
    assert result.loss.item() == pytest.approx(0.1 * (0.5 - math.log(0.5) - 1), rel=1e-6)


def test_policy_loss_gradient_is_zero_where_clipped():
    logp = torch.log(torch.tensor([1.5, 1.0])).requires_grad_()
    weighted(logp, torch.zeros(2), [1.0], [2], [0]).loss.backward()
    assert logp.grad[0].item() == 0.0  # clipped: no push beyond 1 + eps_high
    assert logp.grad[1].item() == pytest.approx(-0.5)  # d(-r/2)/dlogp at r = 1


def token_gradient(logp_value: float, advantage: float, **extra) -> tuple[float, losses.PolicyLoss]:
    """d loss / d logp of one token (its own trajectory and group, weight 1)."""
    logp = torch.tensor([logp_value], requires_grad=True)
    result = weighted(logp, torch.zeros(1), [advantage], [1], [0], **extra)
    result.loss.backward()
    return logp.grad.item(), result


def test_a_token_at_ratio_20_with_a_negative_advantage_gets_a_bounded_gradient_under_the_dual_clip():
    plain, _ = token_gradient(math.log(20.0), -1.0)
    assert plain == pytest.approx(20.0, rel=1e-5)  # -r A: the gradient grows with the ratio
    bounded, result = token_gradient(math.log(20.0), -1.0, dual_clip=3.0)
    assert bounded == 0.0 and result.loss.item() == pytest.approx(3.0) and result.dual_clipped == 1
    below, result = token_gradient(math.log(2.0), -1.0, dual_clip=3.0)  # under the bound: plain PPO's
    assert below == pytest.approx(2.0, rel=1e-5) and result.dual_clipped == 0


def test_the_samplers_ratio_is_truncated_at_the_cap_and_masked_outside_the_band():
    # The proximal policy (logp_old, 0) over the sampler's: rho = 3 (truncated to 2), 20 and 0.1
    # (masked), 1.5 (kept) and NaN (not kept: weight 1). One trajectory, A = +1, ratio 1 each.
    behaviour = torch.log(torch.tensor([1 / 3, 1 / 20, 10.0, 1 / 1.5, math.nan]))
    logp = torch.zeros(5, requires_grad=True)
    result = weighted(logp, torch.zeros(5), [1.0], [5], [0], logp_behaviour=behaviour, importance_cap=2.0, mask_band=(0.2, 5.0))
    result.loss.backward()
    assert logp.grad.tolist() == pytest.approx([-2 / 5, 0.0, 0.0, -1.5 / 5, -1 / 5], rel=1e-5)
    assert (result.behaviour_tokens, result.masked, result.truncated) == (4, 2, 1)
    expected_kl = sum(r - math.log(r) - 1 for r in (3.0, 20.0, 0.1, 1.5))  # k3 of KL(sampler || proximal), r = p_proximal / p_sampler
    assert result.mismatch_kl_sum == pytest.approx(expected_kl, rel=1e-5)


def test_at_staleness_zero_the_update_is_plain_ppos():
    # The sampler's log-probabilities equal the proximal policy's: the weights are 1, nothing is
    # masked, and the loss and gradients are the clipped loss's alone.
    torch.manual_seed(0)
    old = torch.randn(12) * 0.5 - 2
    current = old + torch.randn(12) * 0.3
    advantages, targets, groups = [1.0, -0.5, -1.2], [5, 4, 3], [0, 0, 1]
    grads = []
    for extra in ({}, {"logp_behaviour": old.clone(), "dual_clip": 3.0}):
        logp = current.clone().requires_grad_()
        result = weighted(logp, old, advantages, targets, groups, **extra)
        result.loss.backward()
        grads.append((result.loss.item(), logp.grad))
    (plain_loss, plain_grad), (loss, grad) = grads
    assert loss == pytest.approx(plain_loss, rel=1e-6) and torch.allclose(grad, plain_grad)
    assert result.masked == 0 and result.mismatch_kl_sum == pytest.approx(0.0, abs=1e-6)


def test_the_mismatch_of_two_float32_kernels_does_not_read_zero():
    # vLLM's and the trainer's float32 log-probabilities differ by about 1e-6: the k3 estimate,
    # about d^2 / 2 a token, cancels to 0 when computed in float32.
    old = torch.full((4,), -2.0)
    result = weighted(old.clone().requires_grad_(), old, [1.0], [4], [0], logp_behaviour=old + 1e-6)
    assert result.mismatch_kl_sum == pytest.approx(4 * 0.5e-12, rel=0.1)
