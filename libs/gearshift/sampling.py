"""The sampling rules every caller of the policy shares: a common.v1.Sampling as the options of a
policy call, and how seeds are derived, so the gateway, the executor, evaluation, the loop and
the training jobs seed an episode the same way. No HTTP and no protobuf import here: a Sampling
is read by its fields."""

from __future__ import annotations

import hashlib

from gearshift.errors import InvalidArgument

SEEDS = 2**63  # Sampling.seed is an int64: seeds are taken modulo this, and configs stay below it


def sampling_options(sampling=None) -> dict:
    """temperature, top_p, and seed and penalties (when set) of a policy call for a
    common.v1.Sampling; None: greedy."""
    if sampling is None:
        return {"temperature": 0.0, "top_p": 1.0}
    if not (sampling.temperature >= 0 and 0 <= sampling.top_p <= 1):
        raise InvalidArgument(f"sampling needs temperature >= 0 and top_p in [0, 1], got {sampling.temperature}, {sampling.top_p}")
    if not all(-2 <= p <= 2 for p in (sampling.frequency_penalty, sampling.presence_penalty)):
        raise InvalidArgument(f"sampling penalties must be in [-2, 2], got {sampling.frequency_penalty}, {sampling.presence_penalty}")
    options = {"temperature": sampling.temperature, "top_p": sampling.top_p or 1.0}
    if sampling.HasField("seed"):
        options["seed"] = sampling.seed
    for penalty in ("frequency_penalty", "presence_penalty"):  # left out at 0: a server that lacks them is not asked
        if value := getattr(sampling, penalty):
            options[penalty] = value
    return options


def requested_sampling(request):
    """The request's sampling field, or None when the caller left it unset."""
    return request.sampling if request.HasField("sampling") else None


def with_seed(sampling, seed: int):
    """A copy of sampling (a common.v1.Sampling) with another seed."""
    copy = type(sampling)()
    copy.CopyFrom(sampling)
    copy.seed = seed
    return copy


def derived_seed(*key) -> int:
    """One episode's seed from its identity (a seed, then item, mode, sample...): the same in every
    run and process, and unrelated to any other episode's (the executor seeds call k with seed + k,
    so consecutive seeds would share calls)."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, key)).encode()).digest()[:8], "big") % SEEDS
