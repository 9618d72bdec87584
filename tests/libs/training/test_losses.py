"""Loss functions against values computed by hand."""

import math

import pytest
import torch
from gearshift.training import losses


def test_cross_entropy_is_the_token_mean_over_the_mask():
    logits = torch.log(torch.tensor([[[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]]]))
    tokens = torch.tensor([[0, 1, 1]])
    mask = torch.tensor([[True, True, False]])
    expected = (-math.log(0.5) - math.log(0.75)) / 2
    assert losses.cross_entropy(logits, tokens, mask).item() == pytest.approx(expected, rel=1e-6)


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


def test_policy_loss_clips_high_for_positive_and_low_for_negative_advantages():
    # Row 0 (A = +1): ratios 1.5 (clipped to 1.28) and 1.0. Row 1 (A = -1): ratios 0.5 (clipped to
    # 0.8, -min(-0.5, -0.8) = 0.8) and 1.1 (unclipped: 1.1), third token masked.
    ratios = torch.tensor([[1.5, 1.0, 1.0], [0.5, 1.1, 3.0]])
    logp_old = torch.zeros(2, 3)
    logp = torch.log(ratios)
    mask = torch.tensor([[True, True, False], [True, True, False]])
    result = losses.policy_loss(logp, logp_old, torch.tensor([1.0, -1.0]), mask, torch.tensor([0, 0]))
    row0 = -(1.28 + 1.0) / 2
    row1 = (0.8 + 1.1) / 2
    assert result.loss.item() == pytest.approx((row0 + row1) / 2, rel=1e-6)
    assert result.clipped_high == pytest.approx(1 / 4)
    assert result.clipped_low == pytest.approx(1 / 4)


def test_policy_loss_unclipped_side_keeps_the_ratio():
    # A = +1 with ratio 0.5: min(0.5, clip(0.5)=0.8) = 0.5, so the loss is -0.5 (no clipping below for A > 0).
    result = losses.policy_loss(torch.log(torch.tensor([[0.5]])), torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1, dtype=torch.bool), torch.tensor([0]))
    assert result.loss.item() == pytest.approx(-0.5, rel=1e-6)
    assert result.clipped_low == 0 and result.clipped_high == 0


def test_policy_loss_token_mean_per_trajectory_then_group_mean():
    # Ratio 1 everywhere: per-token loss = -A. Group 0: rows with 1 and 3 tokens, A = 2 and 4:
    # per-trajectory means -2 and -4 -> group mean -3 (a token mean over the group would give -3.5).
    # Group 1: one row, A = 1 -> -1. Loss = mean(-3, -1) = -2.
    mask = torch.tensor([[True, False, False], [True, True, True], [True, True, False]])
    zeros = torch.zeros(3, 3)
    result = losses.policy_loss(zeros, zeros, torch.tensor([2.0, 4.0, 1.0]), mask, torch.tensor([0, 0, 1]))
    assert result.loss.item() == pytest.approx(-2.0, rel=1e-6)


def test_policy_loss_adds_weighted_kl_to_the_reference():
    logp = torch.full((1, 1), math.log(0.5))
    ref = torch.full((1, 1), math.log(0.25))
    result = losses.policy_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 1, dtype=torch.bool), torch.tensor([0]), kl_coef=0.1, logp_ref=ref)
    assert result.loss.item() == pytest.approx(0.1 * (0.5 - math.log(0.5) - 1), rel=1e-6)


def test_policy_loss_gradient_is_zero_where_clipped():
    logp = torch.log(torch.tensor([[1.5, 1.0]])).requires_grad_()
    result = losses.policy_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool), torch.tensor([0]))
    result.loss.backward()
    assert logp.grad[0, 0].item() == 0.0  # clipped: no push beyond 1 + eps_high
    assert logp.grad[0, 1].item() == pytest.approx(-0.5)  # d(-r/2)/dlogp at r = 1
