"""The prefix cache's bookkeeping: longest-prefix lookup, an episode's turns kept as one entry,
LRU eviction within the byte budget, entries of other weights never used."""

from __future__ import annotations

import torch
from gearshift.services.policy_server.prefix_cache import PrefixCache

LAYERS = 2
BYTES_PER_TOKEN = LAYERS * 2 * 4  # keys and values, one float32 each per layer


def kv_of(tokens: list[int]):
    """A fake KV whose values are the token ids, so a test can see which tokens it got."""
    values = torch.tensor(tokens, dtype=torch.float32).reshape(1, 1, -1, 1)
    return [(values.clone(), values.clone()) for _ in range(LAYERS)]


def prefix_tokens(kv) -> list[int]:
    return [int(v) for v in kv[0][0].flatten()] if kv else []


def test_lookup_takes_the_longest_shared_prefix_and_leaves_the_last_token():
    cache, model = PrefixCache(10_000), object()
    cache.store(model, [1, 2, 3, 4], kv_of([1, 2, 3, 4]))
    cache.store(model, [1, 2, 9], kv_of([1, 2, 9]))
    assert prefix_tokens(cache.lookup(model, [1, 2, 3, 4, 5, 6])) == [1, 2, 3, 4]
    assert prefix_tokens(cache.lookup(model, [1, 2, 9, 9])) == [1, 2, 9]
    assert prefix_tokens(cache.lookup(model, [1, 2, 3, 4])) == [1, 2, 3]  # the last one is computed
    assert cache.lookup(model, [7, 1, 2]) is None
    assert cache.stats.hits == 3 and cache.stats.hit_tokens == 4 + 3 + 3


def test_a_longer_turn_replaces_the_one_it_extends():
    cache, model = PrefixCache(10_000), object()
    cache.store(model, [1, 2, 3], kv_of([1, 2, 3]))
    cache.store(model, [1, 2, 3, 4, 5], kv_of([1, 2, 3, 4, 5]))
    cache.store(model, [1, 2], kv_of([1, 2]))  # already inside the longer entry
    assert len(cache) == 1 and cache.nbytes == 5 * BYTES_PER_TOKEN


def test_least_recently_used_entries_go_when_the_budget_is_full():
    cache, model = PrefixCache(8 * BYTES_PER_TOKEN), object()
    cache.store(model, [1, 1, 1], kv_of([1, 1, 1]))
    cache.store(model, [2, 2, 2], kv_of([2, 2, 2]))
    cache.lookup(model, [1, 1, 1, 5])  # touches the first entry
    cache.store(model, [3, 3, 3], kv_of([3, 3, 3]))
    assert cache.lookup(model, [2, 2, 2, 5]) is None  # the least recently used went
    assert prefix_tokens(cache.lookup(model, [1, 1, 1, 5])) == [1, 1, 1]
    assert cache.nbytes <= cache.max_bytes
    cache.store(model, list(range(100, 120)), kv_of(list(range(100, 120))))  # larger than the whole budget
    assert cache.lookup(model, list(range(100, 121))) is None and len(cache) == 2


def test_entries_of_other_weights_are_never_used_and_go_after_a_switch():
    cache, old, new = PrefixCache(10_000), object(), object()
    cache.store(old, [1, 2, 3], kv_of([1, 2, 3]))
    assert cache.lookup(new, [1, 2, 3, 4]) is None
    cache.keep_only(new)
    assert len(cache) == 0 and cache.nbytes == 0


def test_a_stored_entry_is_a_copy():
    cache, model = PrefixCache(10_000), object()
    kv = kv_of([1, 2, 3])
    cache.store(model, [1, 2, 3], kv)
    kv[0][0].zero_()  # the batch buffer it came from is reused
    assert prefix_tokens(cache.lookup(model, [1, 2, 3, 4])) == [1, 2, 3]


def test_a_zero_budget_turns_it_off():
    cache, model = PrefixCache(0), object()
    cache.store(model, [1, 2, 3], kv_of([1, 2, 3]))
    assert cache.lookup(model, [1, 2, 3, 4]) is None and len(cache) == 0
