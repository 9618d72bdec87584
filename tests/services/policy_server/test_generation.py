"""Token choice: greedy at temperature 0, nucleus sampling otherwise."""

from __future__ import annotations

import torch
from gearshift.services.policy_server.generation import SamplingParams, pick_token

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
