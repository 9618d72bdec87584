"""Group z-score advantages against values computed by hand."""

import math

import pytest
import torch
from gearshift.training.advantages import group_zscore


def test_group_zscore_per_group_with_sample_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.5])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    result = group_zscore(rewards, groups, eps=0.0)
    # group 0: mean 0.25, sample std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5
    assert result[:4].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])
    assert result[4:].tolist() == [0.0, 0.0]  # equal rewards: nothing to learn


def test_group_of_two():
    result = group_zscore(torch.tensor([1.0, 0.0]), torch.tensor([7, 7]), eps=0.0)
    assert result.tolist() == pytest.approx([1 / math.sqrt(2), -1 / math.sqrt(2)])


def test_single_rollout_group_gets_zero():
    assert group_zscore(torch.tensor([1.0]), torch.tensor([0])).tolist() == [0.0]
