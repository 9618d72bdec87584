"""Reuse of computed KV caches across requests: an agentic episode sends its whole growing
assistant message on every turn, and many requests share a system prompt, so most of a prompt
was usually computed moments ago.

An entry is a token sequence one generation computed (its prompt, then prompt and output) with
its keys and values. A request takes the entry sharing the longest token prefix with its prompt
and computes only the rest. Entries are whole sequences rather than vLLM's hashed blocks: a few
dozen entries are compared in microseconds, and storing a sequence drops the entries it
extends (the previous turn of the same episode), so an episode holds one entry, not one per turn.
Bounded in bytes; least recently used entries go first. Entries belong to one set of weights:
a hot switch makes the others useless, and they are dropped.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from itertools import count

import torch
from gearshift.services.policy_server.batch_cache import RowKV


@dataclass
class Entry:
    owner: object  # the weights (LoadedModel) that computed it
    tokens: torch.Tensor  # 1-D token ids
    kv: RowKV  # compact copies, [1, kv_heads, len(tokens), head_dim] per layer
    nbytes: int


@dataclass
class PrefixStats:
    lookups: int = 0
    hits: int = 0
    hit_tokens: int = 0  # prompt tokens taken from the cache instead of computed


def _common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(len(a), len(b))
    differ = torch.nonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class PrefixCache:
    """LRU of computed token sequences and their KV, at most max_bytes in all."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.stats = PrefixStats()
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # least recently used first
        self._ids = count()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return sum(len(entry.tokens) for entry in self._entries.values())

    def lookup(self, owner: object, prompt_ids: list[int]) -> RowKV | None:
        """The KV of the longest cached prefix of prompt_ids (views: read-only), or None. At least
        the prompt's last token is always left to compute: its logits pick the first new token."""
        if not self.max_bytes:
            return None
        self.stats.lookups += 1
        prompt = torch.tensor(prompt_ids)
        best, best_key = 0, None
        for key, entry in self._entries.items():
            if entry.owner is owner and (shared := _common_prefix(entry.tokens, prompt)) > best:
                best, best_key = shared, key
        best = min(best, len(prompt_ids) - 1)
        if best <= 0:
            return None
        self._entries.move_to_end(best_key)
        self.stats.hits += 1
        self.stats.hit_tokens += best
        return [(k[:, :, :best], v[:, :, :best]) for k, v in self._entries[best_key].kv]

    def store(self, owner: object, token_ids: list[int], kv: RowKV) -> None:
        """Keeps a copy of kv (the KV of token_ids) unless a cached entry already holds it."""
        if not self.max_bytes or not token_ids:
            return
        tokens = torch.tensor(token_ids)
        for key, entry in list(self._entries.items()):
            if entry.owner is not owner:
                continue
            shared = _common_prefix(entry.tokens, tokens)
            if shared == len(tokens):  # already held (as itself or inside a longer entry)
                self._entries.move_to_end(key)
                return
            if shared == len(entry.tokens):  # the new sequence extends it: it is no longer needed
                self._drop(key)
        kept = [(k.clone(), v.clone()) for k, v in kv]
        nbytes = sum(k.nbytes + v.nbytes for k, v in kept)
        if nbytes > self.max_bytes:
            return
        while self.nbytes + nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[next(self._ids)] = Entry(owner, tokens, kept, nbytes)
        self.nbytes += nbytes

    def keep_only(self, owner: object) -> None:
        """Drops the entries other weights computed (after a hot switch)."""
        for key in [key for key, entry in self._entries.items() if entry.owner is not owner]:
            self._drop(key)

    def _drop(self, key: int) -> None:
        self.nbytes -= self._entries.pop(key).nbytes
