"""Token choice: greedy at temperature 0, nucleus sampling otherwise, after the penalties."""

from __future__ import annotations

import pytest
import torch
from gearshift.services.policy_server.generation import SamplingParams, penalised, pick_token

LOGITS = torch.tensor([1.0, 3.0, 2.9, -5.0])


def test_temperature_zero_is_argmax():
    assert pick_token(LOGITS, SamplingParams(max_tokens=1, temperature=0.0), None) == 1


def test_small_top_p_keeps_only_the_top_token():
    params = SamplingParams(max_tokens=1, temperature=1.0, top_p=0.01)
    generator = torch.Generator().manual_seed(0)
    assert {pick_token(LOGITS, params, generator) for _ in range(50)} == {1}


def test_full_top_p_samples_the_runner_up_too_and_a_seed_repeats():
    params = SamplingParams(max_tokens=1, temperature=1.0, top_p=1.0)
    draws = [pick_token(LOGITS, params, torch.Generator().manual_seed(s)) for s in range(40)]
    assert {1, 2} <= set(draws) and 3 not in draws
    assert draws == [pick_token(LOGITS, params, torch.Generator().manual_seed(s)) for s in range(40)]


def test_penalties_subtract_per_time_and_once_for_each_generated_token():
    params = SamplingParams(max_tokens=1, frequency_penalty=0.5, presence_penalty=0.25)
    penalised_logits = penalised(LOGITS, params, [1, 1, 3])
    assert penalised_logits.tolist() == pytest.approx([1.0, 3.0 - 2 * 0.5 - 0.25, 2.9, -5.0 - 0.5 - 0.25])
    assert pick_token(penalised_logits, SamplingParams(max_tokens=1, temperature=0.0), None) == 2  # the loop is broken


def test_no_penalty_or_nothing_generated_leaves_the_logits_alone():
    assert penalised(LOGITS, SamplingParams(max_tokens=1), [1, 1]) is LOGITS
    assert penalised(LOGITS, SamplingParams(max_tokens=1, frequency_penalty=1.0), []) is LOGITS
