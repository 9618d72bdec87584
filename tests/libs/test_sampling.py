"""The sampling rules: a Sampling as a policy call's options, and derived seeds."""

from __future__ import annotations

import pytest
from gearshift.api.common.v1.common_pb2 import Sampling
from gearshift.errors import InvalidArgument
from gearshift.sampling import SEEDS, derived_seed, sampling_options, with_seed


def test_sampling_options_carry_penalties_only_when_set():
    assert sampling_options() == {"temperature": 0.0, "top_p": 1.0}
    assert sampling_options(Sampling(temperature=0.5, top_p=0.9)) == {"temperature": 0.5, "top_p": 0.9}
    penalised = with_seed(Sampling(temperature=0.0, frequency_penalty=0.5, presence_penalty=-0.25), 7)
    assert sampling_options(penalised) == {"temperature": 0.0, "top_p": 1.0, "seed": 7, "frequency_penalty": 0.5, "presence_penalty": -0.25}
    with pytest.raises(InvalidArgument, match="penalties"):
        sampling_options(Sampling(frequency_penalty=2.5))


def test_a_derived_seed_is_stable_in_range_and_unrelated_to_its_neighbours():
    seed = derived_seed(3, "item-1", "instant", 0)
    assert seed == derived_seed(3, "item-1", "instant", 0) and 0 <= seed < SEEDS
    assert abs(derived_seed(3, "item-1", "instant", 1) - seed) > 1_000
